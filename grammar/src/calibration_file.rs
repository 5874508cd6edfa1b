//! Reading a cluster's calibration file (`cluster { calibration = "cluster.cal.json" }`), the
//! JSON `tessel calibrate` writes: its format is checked here, where a problem can point at the
//! spec's line; what the numbers mean is the cost model's business.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::spec::CalibrationFile;

/// The `format` of calibration files this version reads (and `tessel calibrate` writes).
pub const CALIBRATION_FORMAT: &str = "tessel-calibration/1";

/// Reads `written` (as the spec writes it) relative to `base` (the spec's directory).
pub fn read_calibration_file(written: &str, base: &Path) -> Result<CalibrationFile, String> {
    let path = base.join(written);
    let bytes = std::fs::read(&path).map_err(|error| {
        format!(
            "cannot read calibration `{written}` (relative to the spec): {}",
            match error.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_string(),
                _ => error.to_string(),
            }
        )
    })?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|error| format!("calibration `{written}` is not JSON: {error}"))?;
    let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
    if format != CALIBRATION_FORMAT {
        return Err(format!(
            "calibration `{written}` has format `{format}`, expected `{CALIBRATION_FORMAT}` (a \
             file written by `tessel calibrate`)"
        ));
    }
    let section = |key: &str| -> Result<BTreeMap<String, f64>, String> {
        let Some(object) = value.get(key) else {
            return Ok(BTreeMap::new());
        };
        object
            .as_object()
            .ok_or_else(|| format!("calibration `{written}`: `{key}` is not an object"))?
            .iter()
            .map(|(name, v)| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .map(|x| (name.clone(), x))
                    .ok_or_else(|| {
                        format!("calibration `{written}`: `{key}.{name}` is not a number")
                    })
            })
            .collect()
    };
    let (collectives, gemm, compute) = (
        section("collectives")?,
        section("gemm")?,
        section("compute")?,
    );
    if collectives.is_empty() && gemm.is_empty() && compute.is_empty() {
        return Err(format!(
            "calibration `{written}` calibrates nothing: it has no `collectives`, `gemm` or \
             `compute`"
        ));
    }
    let digest = Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Ok(CalibrationFile {
        path: written.to_string(),
        digest,
        collectives,
        gemm,
        compute,
    })
}
