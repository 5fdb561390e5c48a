// The header check is compiled without the `nccl` feature too, so CI tests it.
#![cfg_attr(not(feature = "nccl"), allow(dead_code))]

//! What Burn's CUDA backend needs besides the driver, checked before its first
//! kernel: it compiles every kernel at run time with NVRTC, against the CUDA
//! headers, and without either cudarc or cubecl panics inside that kernel.

use crate::error::CommError;
use std::path::Path;

/// Where pip's CUDA wheels keep what is needed, for the messages.
const PIP_HINT: &str = "pip's CUDA wheels have them under site-packages/nvidia/ \
    (nvidia-cuda-nvrtc: cuda_nvrtc/lib; nvidia-cuda-runtime: cuda_runtime/include; the \
    CUDA 13 wheels put both under nvidia/cu13)";

/// Checks that the folder cubecl takes the CUDA headers from holds them.
/// `chosen` is where cubecl looks (`cubecl::cuda::install::cuda_path()`:
/// `CUDA_PATH`, else `/usr/local/cuda`, `/opt/cuda`, `/usr` with nvcc);
/// `from_env` whether `CUDA_PATH` chose it; `who` names the process in the
/// message ("local rank 1"). The error is a `CommError::Config` of
/// `CUDA_PATH`.
pub fn check_cuda_headers(
    who: &str,
    chosen: Option<&Path>,
    from_env: bool,
) -> Result<(), CommError> {
    let headers_error = |message: String| CommError::config(None, "CUDA_PATH", message);
    let Some(root) = chosen else {
        return Err(headers_error(format!(
            "{who}: Burn's CUDA backend compiles its kernels at run time against the \
             CUDA headers, and found no CUDA installation (CUDA_PATH unset; no /usr/local/cuda, \
             /opt/cuda or /usr/bin/nvcc); set CUDA_PATH to a CUDA toolkit, or to a folder with \
             include/cuda_runtime.h ({PIP_HINT})"
        )));
    };
    let header = root.join("include").join("cuda_runtime.h");
    if header.is_file() {
        return Ok(());
    }
    let source = if from_env {
        "CUDA_PATH".to_string()
    } else {
        format!("the default {}", root.display())
    };
    Err(headers_error(format!(
        "{who}: Burn's CUDA backend compiles its kernels at run time against the CUDA \
         headers, and looks for them in {} ({source}), but {} is missing; set CUDA_PATH to a \
         CUDA toolkit, or to a folder with include/cuda_runtime.h ({PIP_HINT})",
        root.join("include").display(),
        header.display()
    )))
}

/// Checks that NVRTC, the run-time compiler, can be loaded (the error is a
/// `CommError::Config` of `LD_LIBRARY_PATH`).
#[cfg(feature = "nccl")]
pub fn check_nvrtc(who: &str) -> Result<(), CommError> {
    // SAFETY: only tries to open the library by name.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err(CommError::config(
        None,
        "LD_LIBRARY_PATH",
        format!(
            "{who}: cannot load NVRTC (libnvrtc.so), which Burn's CUDA backend needs to \
             compile its kernels at run time; install the CUDA toolkit's NVRTC, or put the \
             folder holding libnvrtc.so on LD_LIBRARY_PATH ({PIP_HINT})"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_looked_for_where_cubecl_looks() {
        let root = std::env::temp_dir().join(format!("burn-ddp-cuda-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("include")).unwrap();
        let err = check_cuda_headers("rank 3", Some(&root), true).unwrap_err();
        assert!(
            matches!(&err, CommError::Config { setting, .. } if setting == "CUDA_PATH"),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains("rank 3")
                && err.contains("cuda_runtime.h")
                && err.contains("CUDA_PATH")
                && err.contains("nvidia-cuda-runtime"),
            "{err}"
        );
        let err = check_cuda_headers("rank 0", Some(&root), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the default"), "{err}");
        std::fs::write(root.join("include/cuda_runtime.h"), "").unwrap();
        check_cuda_headers("rank 3", Some(&root), true).unwrap();
        let err = check_cuda_headers("rank 1", None, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no CUDA installation") && err.contains("CUDA_PATH"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
