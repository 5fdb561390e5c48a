//! `--cpu-bind`: each worker of a machine on CPUs of its own, read back from
//! the workers' own `/proc/self/status`, with a thread pool as large.

use super::{bounded, free_port, launcher, text, SCENARIO_VAR};
use burn_ddp_testkit::check;
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::time::Duration;

/// Worker side: prints the CPUs it may run on and its rayon pool's size.
pub fn worker(name: &str) -> Option<i32> {
    if name != "cpus" {
        return None;
    }
    let rank = std::env::var("RANK").ok()?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_default();
    println!("cpus {rank} {} threads {threads}", allowed_cpus());
    Some(0)
}

/// This process's `Cpus_allowed_list`, as the kernel writes it (`0-3,8`).
fn allowed_cpus() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux's /proc");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
    line.expect("a Cpus_allowed_list line").trim().to_string()
}

/// `0-3,8` as a set.
fn cpu_set(list: &str) -> BTreeSet<usize> {
    let mut cpus = BTreeSet::new();
    for part in list.split(',') {
        let (start, end) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(start.parse::<usize>().unwrap()..=end.parse::<usize>().unwrap());
    }
    cpus
}

/// What a worker said: its CPUs and its `RAYON_NUM_THREADS`.
type Placed = (BTreeSet<usize>, String);

/// Two workers under the launcher, run with `flags`, `RAYON_NUM_THREADS`
/// set to `rayon` if some, and, with `only_cpu`, the launcher itself
/// confined to that CPU: each rank's CPUs and thread count, and the
/// launcher's stderr.
fn two_workers(
    flags: &[&str],
    rayon: Option<&str>,
    only_cpu: Option<usize>,
) -> Result<(Vec<Placed>, String), String> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let mut args = vec!["--nproc-per-node", "2", "--master-port", &port];
    args.extend_from_slice(flags);
    args.push(exe.to_str().unwrap());
    let mut cmd = launcher(&args);
    cmd.env(SCENARIO_VAR, "cpus");
    if let Some(threads) = rayon {
        cmd.env("RAYON_NUM_THREADS", threads);
    }
    if let Some(cpu) = only_cpu {
        // SAFETY: sched_setaffinity is a plain system call, fine between
        // fork and exec; the set is built before the fork.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut set) };
        unsafe {
            cmd.pre_exec(move || {
                match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }
    let (out, _) = bounded(cmd, Duration::from_secs(30))?;
    check(out.status.success(), || format!("{out:?}"))?;
    let stdout = text(&out.stdout);
    let mut by_rank = vec![None, None];
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("cpus ") {
            let words: Vec<&str> = rest.split(' ').collect();
            let [rank, list, "threads", threads] = words[..] else {
                return Err(format!("unexpected {line:?}"));
            };
            let rank: usize = rank.parse().map_err(|e| format!("{line:?}: {e}"))?;
            by_rank[rank] = Some((cpu_set(list), threads.to_string()));
        }
    }
    let cpus = by_rank.into_iter().collect::<Option<Vec<_>>>();
    let cpus = cpus.ok_or_else(|| format!("a rank did not say its CPUs:\n{stdout}"))?;
    Ok((cpus, text(&out.stderr)))
}

/// Bound by default: disjoint, equal shares of the launcher's CPUs with a
/// thread each, said once; `--cpu-bind none` leaves both on all of them,
/// one thread each; a launcher with one CPU for two workers leaves them to
/// the scheduler and says so.
pub fn workers_run_on_cpus_of_their_own() -> Result<(), String> {
    let mine = cpu_set(&allowed_cpus());
    let (placed, said) = two_workers(&[], None, None)?;
    let threads = |placed: &[Placed]| placed.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>();
    let bound: Vec<BTreeSet<usize>> = placed.iter().map(|(cpus, _)| cpus.clone()).collect();
    if mine.len() >= 2 {
        let share = bound[0].len().to_string();
        check(threads(&placed) == [share.clone(), share], || {
            format!("threads {:?} for shares {bound:?}", threads(&placed))
        })?;
        check(bound[0].is_disjoint(&bound[1]), || format!("{bound:?}"))?;
        check(
            !bound[0].is_empty() && bound[0].len() == bound[1].len(),
            || format!("unequal shares {bound:?}"),
        )?;
        check(bound.iter().all(|cpus| cpus.is_subset(&mine)), || {
            format!("{bound:?} outside {mine:?}")
        })?;
        check(
            said.matches("binding each of the 2 processes to CPUs of its own")
                .count()
                == 1
                && !said.contains("it was bound to"),
            || said.clone(),
        )?;
        // A pool the user made larger than the share is left alone, and said.
        let more = (bound[0].len() + 1).to_string();
        let (placed, said) = two_workers(&[], Some(&more), None)?;
        check(threads(&placed) == [more.clone(), more.clone()], || {
            format!("{placed:?}")
        })?;
        let warning = format!("RAYON_NUM_THREADS={more}, but each process runs on");
        check(said.contains(&warning), || said.clone())?;
    } else {
        check(bound.iter().all(|cpus| *cpus == mine), || {
            format!("{bound:?}")
        })?;
    }

    let (free, said) = two_workers(&["--cpu-bind", "none"], None, None)?;
    check(
        free.iter().all(|(cpus, t)| *cpus == mine && t == "1"),
        || format!("{free:?}, the launcher's {mine:?}"),
    )?;
    check(!said.contains("binding"), || said.clone())?;

    let first = *mine.first().expect("some CPU");
    let (crowded, said) = two_workers(&[], None, Some(first))?;
    let only = BTreeSet::from([first]);
    check(
        crowded.iter().all(|(cpus, t)| *cpus == only && t == "1"),
        || format!("{crowded:?}"),
    )?;
    check(
        said.contains(
            "2 processes on 1 CPU cannot each have CPUs of their own; leaving them to the \
             scheduler",
        ),
        || said.clone(),
    )
}
