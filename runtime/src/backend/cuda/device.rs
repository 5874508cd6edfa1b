//! One GPU as a rank sees it: the context, a compute stream, a second stream for gradient
//! reduction (so that NCCL overlaps the rest of the backward; cudarc's per-buffer events make
//! the compute stream wait only where it reads a reduced buffer), the cuBLAS handle and every
//! kernel, compiled with NVRTC for this device's architecture.

use crate::kernels::ALL;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub compute: Arc<CudaStream>,
    pub reduce: Arc<CudaStream>,
    pub blas: CudaBlas,
    functions: BTreeMap<&'static str, CudaFunction>,
}

impl Device {
    pub fn open(ordinal: usize) -> Result<Device, String> {
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("cannot open GPU {ordinal}: {e:?}"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("GPU {ordinal}: {e:?}"))?;
        let compute = ctx.default_stream();
        let reduce = ctx
            .new_stream()
            .map_err(|e| format!("GPU {ordinal}: cannot create a stream: {e:?}"))?;
        let blas = CudaBlas::new(compute.clone())
            .map_err(|e| format!("GPU {ordinal}: cannot start cuBLAS: {e:?}"))?;
        let mut functions = BTreeMap::new();
        for kernel in ALL {
            let options = CompileOptions {
                options: vec![format!("--gpu-architecture=sm_{major}{minor}")],
                name: Some(format!("{}.cu", kernel.name)),
                ..Default::default()
            };
            let ptx = compile_ptx_with_opts(kernel.source, options)
                .map_err(|e| format!("NVRTC cannot compile {}.cu: {e}", kernel.name))?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("GPU {ordinal} cannot load {}.cu: {e:?}", kernel.name))?;
            for &entry in kernel.entry_points {
                let f = module
                    .load_function(entry)
                    .map_err(|e| format!("{}.cu has no kernel {entry}: {e:?}", kernel.name))?;
                functions.insert(entry, f);
            }
        }
        Ok(Device {
            ctx,
            compute,
            reduce,
            blas,
            functions,
        })
    }

    pub fn function(&self, name: &str) -> &CudaFunction {
        &self.functions[name]
    }
}
