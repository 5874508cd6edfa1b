//! `tessel import hf` on published `config.json` files: golden `.tsl` output, parameter counts
//! against the published sizes, and errors on bad input.

mod common;

use common::check_golden;
use tessel_grammar::{MlpKind, NormKind, PositionKind};
use tessel_interop::hf::SUPPORTED_MODEL_TYPES;
use tessel_interop::{import_hf_config, ImportError, ImportedModel};

const FIXTURES: &[&str] = &[
    "llama3_8b",
    "llama3_1_405b",
    "mistral_7b_v0_1",
    "mixtral_8x7b_v0_1",
    "qwen2_7b",
    "qwen1_5_moe_a2_7b",
    "gpt2",
    "gpt2_xl",
    "pythia_6_9b",
    "gpt_neox_20b",
    "deepseek_v2_lite",
    "deepseek_v3",
];

/// The text of a fixture file under `tests/fixtures`.
fn fixture(name: &str) -> String {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

fn import(name: &str) -> ImportedModel {
    let source = format!("tests/fixtures/{name}.json");
    import_hf_config(&fixture(&format!("{name}.json")), &source)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn import_err(json: &str) -> ImportError {
    import_hf_config(json, "config.json").expect_err("the import should fail")
}

#[test]
fn golden_tsl() {
    for name in FIXTURES {
        check_golden(&format!("import/{name}.tsl"), &import(name).to_tsl());
    }
}

#[test]
fn output_is_deterministic() {
    for name in FIXTURES {
        assert_eq!(import(name).to_tsl(), import(name).to_tsl());
    }
}

/// Reads the `key = value` lines of the `model` block back, independently of the writer, and
/// checks they restate the imported spec.
#[test]
fn tsl_fields_restate_the_spec() {
    for name in FIXTURES {
        let model = import(name);
        let text = model.to_tsl();
        let body: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("model "))
            .collect();
        assert_eq!(body[0], format!("model {} {{", model.spec.name), "{name}");
        assert_eq!(*body.last().unwrap(), "}", "{name}");
        let mut fields = std::collections::BTreeMap::new();
        for line in &body[1..body.len() - 1] {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(" = ").expect("key = value");
            fields.insert(key.trim().to_string(), value.trim().to_string());
        }
        let m = &model.spec;
        let get = |k: &str| fields.get(k).cloned().unwrap_or_default();
        assert_eq!(get("layers"), m.layers.to_string(), "{name}");
        assert_eq!(get("hidden"), m.hidden.to_string(), "{name}");
        assert_eq!(get("heads"), m.heads.to_string(), "{name}");
        assert_eq!(get("kv_heads"), m.kv_heads.to_string(), "{name}");
        let head_dim = fields
            .get("head_dim")
            .map(|v| v.parse::<u64>().unwrap())
            .unwrap_or(m.hidden / m.heads);
        assert_eq!(head_dim, m.head_dim, "{name}");
        assert_eq!(get("ffn_hidden"), m.ffn_hidden.to_string(), "{name}");
        assert_eq!(get("vocab"), m.vocab.to_string(), "{name}");
        let mlp = match m.mlp {
            MlpKind::Gelu => "gelu",
            MlpKind::Swiglu => "swiglu",
        };
        assert_eq!(get("mlp"), mlp, "{name}");
        let norm = match m.norm {
            NormKind::Layernorm => "layernorm",
            NormKind::Rmsnorm => "rmsnorm",
        };
        assert_eq!(get("norm"), norm, "{name}");
        assert_eq!(
            get("tie_embeddings"),
            m.tie_embeddings.to_string(),
            "{name}"
        );
        assert_eq!(get("bias"), m.bias.to_string(), "{name}");
        assert_eq!(
            fields.get("max_seq_len").cloned(),
            m.max_seq_len.map(|n| n.to_string()),
            "{name}"
        );
        let position = match m.position {
            PositionKind::Rope => "rope",
            PositionKind::Learned => "learned",
        };
        assert_eq!(get("position"), position, "{name}");
        match &m.moe {
            None => assert!(!fields.contains_key("moe"), "{name}"),
            Some(moe) => {
                let record = get("moe");
                for (key, value) in [
                    ("experts", moe.experts.to_string()),
                    ("top_k", moe.top_k.to_string()),
                    ("every", moe.every.to_string()),
                    ("expert_ffn_hidden", moe.expert_ffn_hidden.to_string()),
                    ("shared_experts", moe.shared_experts.to_string()),
                    ("first_dense", moe.first_dense.to_string()),
                ] {
                    assert!(
                        record.contains(&format!("{key} = {value}")),
                        "{name}: {record} lacks {key} = {value}"
                    );
                }
            }
        }
    }
}

fn total(name: &str) -> u64 {
    import(name).spec.parameter_count().total
}

fn billions(n: u64) -> f64 {
    n as f64 / 1e9
}

#[test]
fn dense_counts_match_published_sizes_exactly() {
    // Hugging Face's model cards / `model.num_parameters()`.
    assert_eq!(total("llama3_8b"), 8_030_261_248);
    assert_eq!(total("llama3_1_405b"), 405_853_388_800);
    assert_eq!(total("mistral_7b_v0_1"), 7_241_732_096);
    // GPT-2 small ties its output layer to the input embedding: 124.4 M.
    assert_eq!(total("gpt2"), 124_439_808);
    assert_eq!(total("gpt2_xl"), 1_557_611_200);
    // Pythia paper (Biderman et al. 2023), Table 1: 6,857,302,016 total parameters.
    assert_eq!(total("pythia_6_9b"), 6_857_302_016);
    // GPT-NeoX-20B paper (Black et al. 2022): 20,554,567,680 parameters.
    assert_eq!(total("gpt_neox_20b"), 20_554_567_680);
}

#[test]
fn qwen2_count_plus_left_out_biases_is_the_published_count() {
    // Qwen2-7B: 7,615,616,512 parameters, of which 28 · (3584 + 2·512) are q/k/v biases that
    // Tessel's all-or-nothing `bias` cannot hold.
    let model = import("qwen2_7b");
    let left_out = 28 * (3584 + 2 * 512);
    assert_eq!(model.spec.parameter_count().total + left_out, 7_615_616_512);
    assert!(model.to_tsl().contains("129,024 parameters in all"));
}

#[test]
fn mixtral_total_and_active() {
    let count = import("mixtral_8x7b_v0_1").spec.parameter_count();
    // Mistral AI: 46.7 B total, 12.9 B active per token.
    assert_eq!(count.total, 46_702_792_704);
    assert_eq!(count.active, 12_879_925_248);
}

#[test]
fn qwen_moe_total_and_active() {
    let model = import("qwen1_5_moe_a2_7b");
    let count = model.spec.parameter_count();
    // Qwen1.5-MoE-A2.7B: 14.3 B total, 2.7 B activated; the shared expert's 2048-wide sigmoid
    // gate per block (24 · 2048) is left out.
    assert_eq!(count.total + 24 * 2048 + 24 * 3 * 2048, 14_315_784_192);
    assert_eq!((billions(count.total) * 10.0).round() / 10.0, 14.3);
    assert_eq!((billions(count.active) * 10.0).round() / 10.0, 2.7);
    let moe = model.spec.moe.unwrap();
    assert_eq!((moe.shared_experts, moe.expert_ffn_hidden), (4, 1408));
}

#[test]
fn deepseek_v3_lands_within_a_fraction_of_a_percent() {
    let model = import("deepseek_v3");
    let count = model.spec.parameter_count();
    // DeepSeek-V3 as published: 671,026,419,200 parameters without the MTP module (computed
    // matrix by matrix from the paper's shapes), 37 B activated per token.
    let published_total = 671_026_419_200u64;
    let error = (count.total as f64 - published_total as f64).abs() / published_total as f64;
    assert!(error < 1e-4, "total {} off by {error}", count.total);
    assert!(
        (37.0..38.0).contains(&billions(count.active)),
        "active {}",
        count.active
    );
    let moe = model.spec.moe.as_ref().unwrap();
    assert_eq!((moe.first_dense, moe.every, moe.experts), (3, 1, 256));
    assert_eq!((model.spec.kv_heads, model.spec.head_dim), (8, 96));
}

#[test]
fn deepseek_v2_lite_counts() {
    let model = import("deepseek_v2_lite");
    let count = model.spec.parameter_count();
    // DeepSeek-V2 paper: V2-Lite has 15.7 B parameters, 2.4 B activated per token. The
    // approximation matches MLA's projection weights exactly here (head_dim 140 with 8 KV
    // heads), leaving out only the 512-wide latent norm of each of the 27 blocks.
    assert_eq!(count.total + 27 * 512, 15_706_484_224);
    // DeepSeek's activated count leaves out the input embedding (a lookup, no FLOPs).
    let input_embedding = 102_400 * 2048;
    let active = billions(count.active - input_embedding);
    assert!((2.40..2.46).contains(&active), "active {active}");
    assert_eq!((model.spec.kv_heads, model.spec.head_dim), (8, 140));
}

#[test]
fn approximations_are_commented() {
    let qwen = import("qwen2_7b").to_tsl();
    assert!(qwen.contains("biases only on the q, k and v projections"));
    let v3 = import("deepseek_v3").to_tsl();
    assert!(v3.contains("multi-head latent attention"));
    assert!(v3.contains("multi-token-prediction"));
    let neox = import("pythia_6_9b").to_tsl();
    assert!(neox.contains("use_parallel_residual"));
    assert!(neox.contains("25% of each head"));
    let mistral = import("mistral_7b_v0_1").to_tsl();
    assert!(mistral.contains("sliding-window attention (window 4096)"));
    let llama = import("llama3_1_405b").to_tsl();
    assert!(llama.contains("rope_scaling (llama3, factor 8)"));
    // Nothing approximated: no approximation section.
    assert!(!import("gpt2").to_tsl().contains("Approximations"));
}

#[test]
fn header_names_source_and_model_type() {
    let text = import("gpt_neox_20b").to_tsl();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "# Imported by `tessel import hf` from tests/fixtures/gpt_neox_20b.json."
    );
    assert_eq!(
        lines.next().unwrap(),
        "# Hugging Face model_type \"gpt_neox\", architecture GPTNeoXForCausalLM."
    );
}

#[test]
fn model_type_can_come_from_architectures() {
    let json = fixture("mistral_7b_v0_1.json").replace("\"model_type\": \"mistral\",", "");
    let model = import_hf_config(&json, "Mistral-7B-v0.1/config.json").unwrap();
    assert_eq!(model.model_type, "mistral");
    assert_eq!(model.spec.name, "mistral_7b_v0_1");
}

#[test]
fn rename_checks_the_name() {
    let mut model = import("gpt2");
    model.rename("gpt2_small").unwrap();
    assert!(model.to_tsl().contains("model gpt2_small {"));
    let err = model.rename("2small").unwrap_err();
    assert_eq!(
        err.to_string(),
        "`2small` is not a valid model name: use letters, digits and `_`, not starting with a \
         digit"
    );
}

#[test]
fn unknown_model_type_lists_the_supported_ones() {
    let err = import_err(r#"{"model_type": "bert", "hidden_size": 768}"#);
    assert_eq!(
        err.to_string(),
        format!(
            "config.json: unsupported model_type `bert`; supported model types: {}",
            SUPPORTED_MODEL_TYPES.join(", ")
        )
    );
    let err = import_err(r#"{"architectures": ["T5ForConditionalGeneration"]}"#);
    assert!(err
        .to_string()
        .contains("architecture `T5ForConditionalGeneration` is not supported"));
    assert!(err.to_string().contains("LlamaForCausalLM"));
    let err = import_err(r#"{"hidden_size": 768}"#);
    assert!(matches!(err, ImportError::MissingModelType { .. }));
}

#[test]
fn missing_field_is_named() {
    let json = fixture("llama3_8b.json").replace("\"intermediate_size\": 14336,", "");
    let err = import_hf_config(&json, "llama.json").unwrap_err();
    assert_eq!(
        err.to_string(),
        "llama.json: field `intermediate_size` is required for model_type `llama` but is missing"
    );
}

#[test]
fn unknown_activation_is_an_error() {
    let json = fixture("llama3_8b.json").replace("\"silu\"", "\"mish\"");
    let err = import_hf_config(&json, "llama.json").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "llama.json: field `hidden_act` = \"mish\" cannot be imported: unknown activation"
        ),
        "{text}"
    );
    let json = fixture("gpt2.json").replace("\"gelu_new\"", "\"tanh\"");
    let err = import_hf_config(&json, "gpt2.json").unwrap_err();
    assert!(err.to_string().contains("`activation_function` = \"tanh\""));
}

#[test]
fn malformed_json_gives_line_and_column() {
    let err = import_err("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}");
    match &err {
        ImportError::Json { line, column, .. } => assert_eq!((*line, *column), (3, 23)),
        other => panic!("expected a JSON error, got {other:?}"),
    }
    assert!(err
        .to_string()
        .starts_with("config.json:3:23: not valid JSON: "));
    assert!(matches!(
        import_err("[1, 2]"),
        ImportError::NotAnObject { .. }
    ));
}

#[test]
fn wrong_types_and_values_are_named() {
    let json = fixture("llama3_8b.json")
        .replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": \"32\"");
    assert_eq!(
        import_hf_config(&json, "c.json").unwrap_err().to_string(),
        "c.json: field `num_hidden_layers` should be a non-negative whole number, found the string \"32\""
    );
    let json = fixture("llama3_8b.json")
        .replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
    assert_eq!(
        import_hf_config(&json, "c.json").unwrap_err().to_string(),
        "c.json: field `num_key_value_heads` = 5 cannot be imported: it must divide num_attention_heads = 32"
    );
    let json = fixture("mixtral_8x7b_v0_1.json")
        .replace("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
    assert!(import_hf_config(&json, "c.json")
        .unwrap_err()
        .to_string()
        .contains("routes to more experts than the 8 there are"));
    let json = fixture("llama3_8b.json").replace("\"hidden_size\": 4096", "\"hidden_size\": 0");
    assert!(import_hf_config(&json, "c.json")
        .unwrap_err()
        .to_string()
        .contains("`hidden_size` = 0 cannot be imported: it must be at least 1"));
    let json =
        fixture("llama3_8b.json").replace("\"hidden_size\": 4096", "\"hidden_size\": 4096.5");
    assert!(matches!(
        import_hf_config(&json, "c.json").unwrap_err(),
        ImportError::WrongType { .. }
    ));
}

#[test]
fn absurd_sizes_are_refused_not_overflowed() {
    let json = fixture("llama3_8b.json")
        .replace("\"hidden_size\": 4096", "\"hidden_size\": 16777216")
        .replace(
            "\"intermediate_size\": 14336",
            "\"intermediate_size\": 16777216",
        );
    let err = import_hf_config(&json, "c.json").unwrap_err();
    assert!(
        err.to_string().contains("beyond anything Tessel plans"),
        "{err}"
    );
    let json = fixture("llama3_8b.json").replace(
        "\"vocab_size\": 128256",
        "\"vocab_size\": 18446744073709551615",
    );
    assert!(import_hf_config(&json, "c.json")
        .unwrap_err()
        .to_string()
        .contains("implausibly large"));
    let json = fixture("llama3_8b.json")
        .replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": 100000");
    assert!(import_hf_config(&json, "c.json")
        .unwrap_err()
        .to_string()
        .contains("at most 4096 layers"));
}

#[test]
fn qwen_moe_dense_blocks_that_no_pattern_expresses_are_noted() {
    let json = fixture("qwen1_5_moe_a2_7b.json").replace(
        "\"decoder_sparse_step\": 1,",
        "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [5, 11],",
    );
    let model = import_hf_config(&json, "qwen_moe.json").unwrap();
    let moe = model.spec.moe.as_ref().unwrap();
    // 22 expert blocks in the source; the closest Tessel pattern keeps the count at 22.
    assert_eq!(model.spec.moe_layers(), 22);
    assert!(moe.first_dense > 0 || moe.every > 1);
    assert!(model.to_tsl().contains("placed differently"));
}

#[test]
fn files_are_read_and_missing_files_reported() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2.json");
    let model = tessel_interop::import_hf_file(&path).unwrap();
    assert_eq!(model.spec.name, "gpt2");
    let err =
        tessel_interop::import_hf_file(std::path::Path::new("no/such/config.json")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("no/such/config.json: cannot read: "),
        "{err}"
    );
}

/// Every field of every fixture replaced by hostile values: the importer answers with a model
/// or an error, never a panic.
#[test]
fn hostile_values_never_panic() {
    let hostile = [
        "null",
        "0",
        "-1",
        "1.5",
        "1e300",
        "18446744073709551615",
        "\"x\"",
        "[]",
        "[1, \"a\"]",
        "{}",
        "true",
        "4097",
        "16777217",
    ];
    for name in FIXTURES {
        let text = fixture(&format!("{name}.json"));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        for key in &keys {
            for replacement in hostile {
                let mut mutated = value.clone();
                mutated[key.as_str()] = serde_json::from_str(replacement).unwrap();
                let json = serde_json::to_string(&mutated).unwrap();
                if let Ok(model) = import_hf_config(&json, "c.json") {
                    // Whatever is accepted renders and counts without overflow.
                    let _ = model.to_tsl();
                }
            }
            let mut removed = value.clone();
            removed.as_object_mut().unwrap().remove(key);
            let _ = import_hf_config(&serde_json::to_string(&removed).unwrap(), "c.json");
        }
    }
}
