//! Translations between Tessel and other tools.
//!
//! - [`hf`]: a Hugging Face `config.json` to a Tessel `model` block (`tessel import hf`).
//! - [`export`]: a spec and one strategy to a Megatron-LM launch script, a torchtitan job config
//!   or a DeepSpeed config (`tessel export`).
//! - [`traces`]: measurements other tools write (nccl-tests output), for `tessel calibrate`.
//!
//! Both directions are lossy where the other side has no counterpart; what is lost or
//! approximated is reported in words next to the output, never silently dropped.

pub mod export;
pub mod hf;
mod number_format;
pub mod traces;

pub use export::{export, export_with, ExportOptions, ExportOutput, ExportTarget};
pub use hf::{import_hf_config, import_hf_file, ImportError, ImportedModel};
