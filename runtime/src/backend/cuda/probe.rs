//! Checks, before anything else touches CUDA, that the driver library, a device, cuBLAS, NVRTC
//! and NCCL are all there. cudarc loads each library on first use and panics when it is
//! missing, so every check dlopens first and the device query runs under `catch_unwind`.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaProbe {
    pub devices: usize,
}

/// The first missing piece, as a message that says what to install or check.
pub fn probe() -> Result<CudaProbe, String> {
    // SAFETY: each call only tries to dlopen the library under its known names.
    let present = unsafe {
        [
            (
                cudarc::driver::sys::is_culib_present(),
                "the CUDA driver library (libcuda.so) was not found: install the NVIDIA driver, \
                 or add its directory to LD_LIBRARY_PATH",
            ),
            (
                cudarc::cublas::sys::is_culib_present(),
                "cuBLAS (libcublas.so) was not found: install the CUDA toolkit or the \
                 nvidia-cublas-cu12 wheel and add its lib directory to LD_LIBRARY_PATH",
            ),
            (
                cudarc::nvrtc::sys::is_culib_present(),
                "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit or the \
                 nvidia-cuda-nvrtc-cu12 wheel and add its lib directory to LD_LIBRARY_PATH",
            ),
            (
                cudarc::nccl::sys::is_culib_present(),
                "NCCL (libnccl.so) was not found: install it or the nvidia-nccl-cu12 wheel and \
                 add its lib directory to LD_LIBRARY_PATH",
            ),
        ]
    };
    if let Some((_, message)) = present.iter().find(|(ok, _)| !ok) {
        return Err((*message).to_string());
    }
    let count = catch_unwind(AssertUnwindSafe(cudarc::driver::CudaContext::device_count))
        .map_err(|_| "the CUDA driver library failed to load".to_string())?
        .map_err(|e| format!("the CUDA driver reports an error: {e:?}"))?;
    if count <= 0 {
        return Err("the CUDA driver found no GPU".into());
    }
    Ok(CudaProbe {
        devices: count as usize,
    })
}
