//! Compiles every CUDA kernel source to PTX with NVRTC (no GPU needed). CI installs the
//! `nvidia-cuda-nvrtc-cu12` wheel and puts its `libnvrtc.so` on `LD_LIBRARY_PATH`; without it
//! the test says so and skips.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use tessel_runtime::kernels::{ALL, DEFAULT_ARCH};

fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library under its known names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

#[test]
fn every_kernel_compiles_to_ptx_with_its_entry_points() {
    if !nvrtc_present() {
        eprintln!(
            "skipped: libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12 and add its lib \
             directory to LD_LIBRARY_PATH)"
        );
        return;
    }
    for kernel in ALL {
        let options = CompileOptions {
            arch: Some(DEFAULT_ARCH),
            name: Some(format!("{}.cu", kernel.name)),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(kernel.source, options)
            .unwrap_or_else(|e| panic!("{} does not compile: {e}", kernel.name));
        let text = ptx.to_src();
        assert!(
            text.contains(".target sm_80"),
            "{} was not compiled for sm_80",
            kernel.name
        );
        for entry in kernel.entry_points {
            assert!(
                text.contains(&format!(".entry {entry}(")),
                "{} has no entry point {entry}",
                kernel.name
            );
        }
        let entries = text.matches(".entry ").count();
        assert_eq!(
            entries,
            kernel.entry_points.len(),
            "{} lists {} entry points but defines {entries}",
            kernel.name,
            kernel.entry_points.len()
        );
    }
}
