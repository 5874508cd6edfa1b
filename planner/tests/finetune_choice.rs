//! `finetune = { method = auto }`: the planner keeps LoRA where memory does not bind and
//! takes LoRA-FA where it does.

use tessel_grammar::{load_str, FinetuneMethod, Spec};
use tessel_planner::{plan_finetune, Objective, PlanOptions, StageCostModel};
use tessel_symbolic::cost::CostModel;

const MODELS: &str = r#"
model llama3_8b {
  layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn_hidden = 14336; vocab = 128256
  mlp = swiglu; norm = rmsnorm; tie_embeddings = false; max_seq_len = 8192
}
model llama3_70b {
  layers = 80; hidden = 8192; heads = 64; kv_heads = 8; ffn_hidden = 28672; vocab = 128256
  mlp = swiglu; norm = rmsnorm; tie_embeddings = false; max_seq_len = 8192
}
cluster node { gpu = H100_SXM; nodes = 1; gpus_per_node = 8
               intra_node = { bandwidth = 450 GB/s } }
"#;

fn chosen(model: &str, seq_len: u64, global_batch: u64) -> (FinetuneMethod, f64) {
    let text = format!(
        "{MODELS}\ntrain {{ model = {model}; cluster = node; seq_len = {seq_len}; \
         global_batch = {global_batch}\n  finetune = {{ method = auto, rank = 16 }} }}"
    );
    let spec = load_str("auto.tsl", &text).unwrap();
    let factory = |s: &Spec| {
        CostModel::new(s)
            .map(|m| Box::new(m) as Box<dyn StageCostModel>)
            .map_err(|e| e.to_string())
    };
    let options = PlanOptions {
        model_for_spec: Some(&factory),
        objective: Objective::Pessimistic,
        ..PlanOptions::default()
    };
    let plan = plan_finetune(&spec, &options).unwrap().plan;
    let method = plan.spec.train.finetune.unwrap().method;
    (method, plan.prediction.step_time_s)
}

#[test]
fn lora_where_memory_does_not_bind() {
    // Llama 3 8B on eight H100s: LoRA's best plan fits as it would with unlimited memory.
    let (method, _) = chosen("llama3_8b", 4096, 64);
    assert_eq!(method, FinetuneMethod::Lora);
}

#[test]
fn lora_fa_where_memory_binds() {
    // Llama 3 70B at 8,192 tokens on eight H100s: LoRA's inputs of the frozen projections
    // crowd out the micro-batches or force recompute; LoRA-FA's plan is faster.
    let (method, _) = chosen("llama3_70b", 8192, 32);
    assert_eq!(method, FinetuneMethod::LoraFa);
}
