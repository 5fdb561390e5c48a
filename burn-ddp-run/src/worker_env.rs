//! What the launcher adds to every worker's environment where the user's own
//! says nothing: thread pools of one thread when several workers share a
//! machine, and glibc's allocator keeping freed memory for the next step.
//! A variable the user set is left alone, and each default is said once.

use crate::cli::LaunchConfig;

/// A variable set in every worker, and its value.
pub(crate) type Setting = (&'static str, &'static str);

/// Thread-pool sizes set to 1 per worker when several share a machine.
const THREAD_VARS: [&str; 2] = ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"];

/// glibc's allocator: blocks up to 32 MiB (the most its own adjustment
/// reaches) come from the heap, and up to 1 GiB free at the heap's top stays
/// there. Left to adjust itself, glibc hands a CPU backend's tensors (a few
/// MiB each) back to the kernel at every step and faults them in again the
/// next: a sixth of the MNIST CNN's step (docs/benchmarks.md).
const ALLOCATOR: [Setting; 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
    ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
];

/// The defaults for this launch, each said once.
pub(crate) fn defaults(config: &LaunchConfig) -> Vec<Setting> {
    let user_set = |var: &str| std::env::var_os(var).is_some();
    let threads = thread_pools(config.nproc_per_node, user_set);
    if !threads.is_empty() {
        log::info!(
            "setting {} for each of the {} processes to avoid oversubscribing \
             the CPU; set them yourself to tune",
            listed(&threads),
            config.nproc_per_node
        );
    }
    let allocator = allocator(user_set);
    if !allocator.is_empty() {
        log::info!(
            "setting {} for each process, so glibc keeps freed tensor memory for the \
             next step instead of returning it and faulting it in again; set either \
             yourself to choose",
            listed(&allocator)
        );
    }
    threads.into_iter().chain(allocator).collect()
}

/// OpenMP's (BLAS) and rayon's (Burn's CPU backends) pools of one thread
/// each, when several workers run here: pools as large as the machine in
/// every worker oversubscribe the CPU, as torchrun warns.
fn thread_pools(nproc_per_node: usize, user_set: impl Fn(&str) -> bool) -> Vec<Setting> {
    if nproc_per_node <= 1 {
        return Vec::new();
    }
    THREAD_VARS
        .into_iter()
        .filter(|var| !user_set(var))
        .map(|var| (var, "1"))
        .collect()
}

/// The allocator's settings, where glibc reads them (Linux with glibc), unless
/// the user chose either: the two only make sense together.
fn allocator(user_set: impl Fn(&str) -> bool) -> Vec<Setting> {
    if !cfg!(all(target_os = "linux", target_env = "gnu"))
        || ALLOCATOR.iter().any(|(var, _)| user_set(var))
    {
        return Vec::new();
    }
    ALLOCATOR.to_vec()
}

/// `A=1 and B=2`.
fn listed(settings: &[Setting]) -> String {
    settings
        .iter()
        .map(|(var, value)| format!("{var}={value}"))
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(settings: &[Setting]) -> Vec<&'static str> {
        settings.iter().map(|(var, _)| *var).collect()
    }

    #[test]
    fn several_workers_get_one_thread_each_unless_the_user_chose() {
        let none_set = |_: &str| false;
        assert_eq!(
            thread_pools(2, none_set),
            vec![("OMP_NUM_THREADS", "1"), ("RAYON_NUM_THREADS", "1")]
        );
        assert!(thread_pools(1, none_set).is_empty());
        let rayon_set = |var: &str| var == "RAYON_NUM_THREADS";
        assert_eq!(names(&thread_pools(4, rayon_set)), ["OMP_NUM_THREADS"]);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_allocator_keeps_memory_unless_the_user_set_either_variable() {
        assert_eq!(
            allocator(|_| false),
            vec![
                ("MALLOC_MMAP_THRESHOLD_", "33554432"),
                ("MALLOC_TRIM_THRESHOLD_", "1073741824")
            ]
        );
        assert!(allocator(|var| var == "MALLOC_TRIM_THRESHOLD_").is_empty());
        assert!(allocator(|var| var == "MALLOC_MMAP_THRESHOLD_").is_empty());
    }

    #[test]
    fn settings_are_listed_as_the_message_shows_them() {
        assert_eq!(
            listed(&[("A", "1"), ("B", "22")]),
            "A=1 and B=22".to_string()
        );
    }
}
