//! `tessel import hf CONFIG`: a Hugging Face `config.json` as a Tessel `model` block.

use std::path::PathBuf;
use std::process::ExitCode;

use super::EXIT_BAD_INPUT;

#[derive(clap::Subcommand)]
pub enum Source {
    /// A Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2, GPT-2, GPT-NeoX, DeepSeek).
    Hf(HfArgs),
}

#[derive(clap::Args)]
pub struct HfArgs {
    /// The `config.json` file.
    pub config: PathBuf,
    /// Name of the model block (default: from the file's folder or `model_type`).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the block to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(source: &Source) -> ExitCode {
    let Source::Hf(args) = source;
    let imported = tessel_interop::import_hf_file(&args.config).and_then(|mut model| {
        if let Some(name) = &args.name {
            model.rename(name)?;
        }
        Ok(model)
    });
    let model = match imported {
        Ok(model) => model,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    super::write_output(args.output.as_deref(), &model.to_tsl())
}
