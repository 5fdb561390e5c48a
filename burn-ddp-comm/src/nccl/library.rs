// Used by the `nccl` feature; compiled without it too, so CI tests it.
#![cfg_attr(not(feature = "nccl"), allow(dead_code))]

//! Finding libnccl before the first NCCL call.
//!
//! cudarc loads NCCL lazily and panics when it cannot; we look first, so a
//! missing library is an error that says what to install.

/// The message for a machine where NCCL cannot be loaded. `versioned_only` is
/// set when `libnccl.so.2` loads but no name cudarc looks for does (pip's
/// `nvidia-nccl-cu12` wheel ships only that file).
pub(crate) fn missing_nccl_message(rank: usize, versioned_only: Option<&str>) -> String {
    let hint = match versioned_only {
        Some(found) => format!(
            "{found} is installed, but it is only found under the name libnccl.so; \
             make a link, e.g. `ln -s {found} $DIR/libnccl.so` with $DIR on \
             LD_LIBRARY_PATH"
        ),
        None => "install NCCL (Debian/Ubuntu: `apt install libnccl2 libnccl-dev` from \
                 NVIDIA's CUDA repository; conda: `nccl`), and make sure a file named \
                 libnccl.so is on LD_LIBRARY_PATH (pip's nvidia-nccl wheels ship only \
                 libnccl.so.2: link libnccl.so to it)"
            .to_string(),
    };
    format!(
        "rank {rank}: cannot load the NCCL library for GPU collectives: {hint}; or set \
         BURN_DDP_BACKEND=tcp to reduce through host memory instead"
    )
}

/// Whether NCCL and the CUDA driver can be loaded; the error says how to fix it.
#[cfg(feature = "nccl")]
pub(crate) fn check_nccl_loadable(rank: usize) -> Result<(), String> {
    // SAFETY: these only try to open shared libraries by name.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err(format!(
            "rank {rank}: cannot load the CUDA driver (libcuda.so); is this a GPU \
             machine with NVIDIA's driver installed?"
        ));
    }
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Ok(());
    }
    let versioned = "libnccl.so.2";
    // SAFETY: opening NCCL runs no initialisation code that needs our care.
    let versioned_only = unsafe { libloading::Library::new(versioned) }
        .is_ok()
        .then_some(versioned);
    Err(missing_nccl_message(rank, versioned_only))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_rank_the_fix_and_the_way_out() {
        let plain = missing_nccl_message(3, None);
        assert!(
            plain.starts_with("rank 3: cannot load the NCCL library"),
            "{plain}"
        );
        assert!(plain.contains("libnccl.so.2: link libnccl.so"), "{plain}");
        assert!(plain.contains("BURN_DDP_BACKEND=tcp"), "{plain}");
        let wheel = missing_nccl_message(0, Some("libnccl.so.2"));
        assert!(
            wheel.contains("ln -s libnccl.so.2 $DIR/libnccl.so"),
            "{wheel}"
        );
    }
}
