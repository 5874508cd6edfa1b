//! A small reader for RFC 4180 CSV (quoted fields, doubled quotes, commas and newlines inside
//! quotes), enough for the published-runs table.

/// Splits CSV text into records of fields.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if quoted {
            match ch {
                '"' if chars.peek() == Some(&'"') => {
                    field.push('"');
                    chars.next();
                }
                '"' => quoted = false,
                other => field.push(other),
            }
            continue;
        }
        match ch {
            '"' => quoted = true,
            ',' => record.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            other => field.push(other),
        }
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}

/// A CSV file read by column name: its header and records.
pub struct Table {
    header: Vec<String>,
    records: Vec<Vec<String>>,
}

impl Table {
    /// Reads the CSV file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Table, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let mut records = parse_csv(&text).into_iter();
        Ok(Table {
            header: records.next().unwrap_or_default(),
            records: records.collect(),
        })
    }

    /// A problem naming the first of `columns` the header lacks.
    pub fn require(&self, path: &std::path::Path, columns: &[&str]) -> Result<(), String> {
        match columns
            .iter()
            .find(|c| !self.header.iter().any(|h| h == *c))
        {
            Some(missing) => Err(format!("{}: no column `{missing}`", path.display())),
            None => Ok(()),
        }
    }

    /// Each record with its line in the file (the header is line 1) and a reader of its
    /// fields by column name: trimmed, empty when the column or the field is missing.
    pub fn rows(&self) -> impl Iterator<Item = (usize, impl Fn(&str) -> String + '_)> + '_ {
        self.records.iter().enumerate().map(move |(index, record)| {
            let get = move |name: &str| {
                self.header
                    .iter()
                    .position(|h| h == name)
                    .and_then(|i| record.get(i))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            (index + 2, get)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_csv;

    #[test]
    fn quotes_commas_and_newlines() {
        let rows = parse_csv("a,b,c\n1,\"x, \"\"y\"\"\nz\",3\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], vec!["1", "x, \"y\"\nz", "3"]);
    }
}
