//! What the launcher adds to every worker's environment where the user's own
//! says nothing: thread pools as large as a worker's share of the CPUs when
//! several workers share a machine, and glibc's allocator keeping freed
//! memory for the next step. A variable the user set is left alone, and
//! each default is said once.

use crate::cli::LaunchConfig;

/// A variable set in every worker, and its value.
pub(crate) type Setting = (&'static str, String);

/// Thread-pool sizes set per worker when several share a machine.
const THREAD_VARS: [&str; 2] = ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"];

/// glibc's allocator: blocks up to 32 MiB (the most its own adjustment
/// reaches) come from the heap, and up to 1 GiB free at the top of the main
/// heap stays there. Left to adjust itself, glibc hands a CPU backend's
/// tensors (a few MiB each) back to the kernel at every step and faults them
/// in again the next: the MNIST CNN's step was 6-20% longer for it
/// (docs/benchmarks.md). Either variable set stops glibc's adjustment of
/// both, hence both or neither.
const ALLOCATOR: [(&str, &str); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
    ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
];

/// The launcher's environment, names and values (lossy where not UTF-8).
type Environment = Vec<(String, String)>;

/// The defaults for this launch, each said once; `cpus_each`: the CPUs of
/// each worker's own, when they are bound.
pub(crate) fn defaults(config: &LaunchConfig, cpus_each: Option<usize>) -> Vec<Setting> {
    let env: Environment = std::env::vars_os()
        .map(|(name, value)| {
            let lossy = |s: std::ffi::OsString| s.to_string_lossy().into_owned();
            (lossy(name), lossy(value))
        })
        .collect();
    let threads = thread_pools(config.nproc_per_node, cpus_each, &env);
    if !threads.is_empty() {
        log::info!(
            "setting {} for each of the {} processes to avoid oversubscribing \
             the CPU; set them yourself to tune",
            listed(&threads),
            config.nproc_per_node
        );
    }
    let allocator = if config.no_malloc_tuning {
        Vec::new()
    } else {
        allocator(&env)
    };
    if !allocator.is_empty() {
        log::info!(
            "setting {} for each process, so glibc keeps freed tensor memory for the \
             next step instead of returning it and faulting it in again; set both \
             yourself to choose, or --no-malloc-tuning to leave glibc to itself",
            listed(&allocator)
        );
    }
    threads.into_iter().chain(allocator).collect()
}

/// OpenMP's (BLAS) and rayon's (Burn's CPU backends) pools, when several
/// workers run here: as many threads as a bound worker has CPUs of its own,
/// else one (pools as large as the machine in every worker oversubscribe
/// the CPU, as torchrun warns). A pool the user sized larger than the share
/// is said to crowd it.
fn thread_pools(
    nproc_per_node: usize,
    cpus_each: Option<usize>,
    env: &Environment,
) -> Vec<Setting> {
    if nproc_per_node <= 1 {
        return Vec::new();
    }
    let threads = cpus_each.unwrap_or(1);
    for (name, value) in env {
        let users = THREAD_VARS
            .contains(&name.as_str())
            .then(|| value.parse::<usize>().ok());
        if let (Some(Some(set)), Some(cpus)) = (users, cpus_each) {
            if set > cpus {
                log::warn!(
                    "{name}={set}, but each process runs on {} of its own: its threads \
                     take turns on them; set {name}={cpus} or pass --cpu-bind none",
                    crate::cpu_binding::counted(cpus)
                );
            }
        }
    }
    THREAD_VARS
        .into_iter()
        .filter(|var| !env.iter().any(|(name, _)| name == var))
        .map(|var| (var, threads.to_string()))
        .collect()
}

/// The allocator's settings, where glibc reads them (a launcher built for
/// Linux with glibc), unless the user configures glibc's malloc: any of its
/// `MALLOC_` variables (several stop its adjustment as ours do), or a
/// `glibc.malloc.` tunable.
fn allocator(env: &Environment) -> Vec<Setting> {
    let users_choice = env.iter().any(|(name, value)| {
        name.starts_with("MALLOC_") || (name == "GLIBC_TUNABLES" && value.contains("glibc.malloc."))
    });
    if !cfg!(all(target_os = "linux", target_env = "gnu")) || users_choice {
        return Vec::new();
    }
    ALLOCATOR
        .map(|(var, value)| (var, value.to_string()))
        .to_vec()
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

    /// An environment holding `set` alone.
    fn only(set: &[(&str, &str)]) -> Environment {
        set.iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    /// `(var, value)` pairs as settings.
    fn settings(pairs: &[(&'static str, &str)]) -> Vec<Setting> {
        pairs
            .iter()
            .map(|(var, value)| (*var, value.to_string()))
            .collect()
    }

    #[test]
    fn several_workers_get_a_thread_per_cpu_of_their_own_unless_the_user_chose() {
        assert_eq!(
            thread_pools(2, None, &only(&[])),
            settings(&[("OMP_NUM_THREADS", "1"), ("RAYON_NUM_THREADS", "1")])
        );
        assert_eq!(
            thread_pools(2, Some(4), &only(&[])),
            settings(&[("OMP_NUM_THREADS", "4"), ("RAYON_NUM_THREADS", "4")])
        );
        assert!(thread_pools(1, Some(8), &only(&[])).is_empty());
        let rayon_set = only(&[("RAYON_NUM_THREADS", "4")]);
        assert_eq!(
            names(&thread_pools(4, None, &rayon_set)),
            ["OMP_NUM_THREADS"]
        );
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_allocator_keeps_memory_unless_its_settings_are_the_users() {
        assert_eq!(
            allocator(&only(&[])),
            settings(&[
                ("MALLOC_MMAP_THRESHOLD_", "33554432"),
                ("MALLOC_TRIM_THRESHOLD_", "1073741824")
            ])
        );
        for users in [
            ("MALLOC_TRIM_THRESHOLD_", "1"),
            ("MALLOC_MMAP_THRESHOLD_", "1"),
            ("MALLOC_TOP_PAD_", "1"),
            ("MALLOC_ARENA_MAX", "2"),
            ("GLIBC_TUNABLES", "glibc.malloc.arena_max=2"),
        ] {
            assert!(allocator(&only(&[users])).is_empty(), "{users:?}");
        }
        let others = only(&[("GLIBC_TUNABLES", "glibc.pthread.rseq=0"), ("HOME", "/")]);
        assert_eq!(allocator(&others).len(), 2);
    }

    #[test]
    fn settings_are_listed_as_the_message_shows_them() {
        assert_eq!(
            listed(&settings(&[("A", "1"), ("B", "22")])),
            "A=1 and B=22".to_string()
        );
    }
}
