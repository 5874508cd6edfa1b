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
