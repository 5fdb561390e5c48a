//! burn-ddp programs started by a real Slurm (one node: munged, slurmctld and
//! slurmd from the test bed): `srun` with no launcher and no `MASTER_ADDR`
//! (rank 0 hosts the store on the step's first node), `sbatch` of the job
//! script docs/launching.md shows, and `scancel` and a killed task ending
//! every other task with nothing left behind. One test, so the cases share
//! one cluster and run one after the other.

use burn_ddp_testkit::programs::{example, launcher, relative, run, scratch, stdout, toy_losses};
use burn_ddp_testkit::SlurmCluster;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

/// A named check on the shared cluster.
type Case = (&'static str, fn(&SlurmCluster) -> Result<(), String>);

#[test]
fn programs_under_srun_and_sbatch() {
    let Some(cluster) = SlurmCluster::start().unwrap() else {
        return;
    };
    let cases: [Case; 6] = [
        ("srun -n 2 runs the collectives", collectives),
        ("burn-ddp-run inside an allocation", launcher_per_node),
        ("srun -n 2 toy equals one process with the whole batch", toy),
        ("sbatch runs the documented job script", sbatch),
        ("scancel ends every task", scancel),
        ("a task killed with SIGKILL ends the others", killed_task),
    ];
    let mut failed = Vec::new();
    for (name, case) in cases {
        let started = Instant::now();
        match case(&cluster) {
            Ok(()) => eprintln!("    {name}: ok ({:.1}s)", started.elapsed().as_secs_f64()),
            Err(why) => {
                eprintln!("    {name}: FAILED\n{why}");
                failed.push(name);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "failed: {failed:?}\ncluster logs:\n{}",
        cluster.logs()
    );
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Each rank's four lines, as collectives_lab.py prints them.
fn collectives_lines(world: usize) -> Vec<String> {
    let sum = (world * (world - 1) / 2) as f32;
    let ranks: Vec<String> = (0..world).map(|r| r.to_string()).collect();
    let mut lines = Vec::new();
    for rank in 0..world {
        let block: Vec<f32> = (2 * rank..2 * rank + 2)
            .map(|i| (world * i) as f32 + 100.0 * sum)
            .collect();
        lines.push(format!("{rank} all_reduce {sum:?}"));
        lines.push(format!("{rank} all_gather [{}]", ranks.join(", ")));
        lines.push(format!("{rank} broadcast 2026"));
        lines.push(format!("{rank} reduce_scatter {block:?}"));
    }
    lines
}

fn collectives(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-collectives");
    let mut srun = cluster.command("srun");
    srun.args(["-n", "2"]).arg(example("collectives"));
    let out = run(srun, &dir, LIMIT);
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    check(out.status.success(), || {
        format!("{:?}\n{text}\n{stderr}", out.status)
    })?;
    for line in collectives_lines(2) {
        check(text.lines().any(|l| l.trim() == line), || {
            format!("no {line:?} in:\n{text}")
        })?;
    }
    Ok(())
}

/// The documented one-launcher-per-node form (`srun --ntasks-per-node 1`
/// running burn-ddp-run with the allocation's node count, index and first
/// node), on the bed's one node with 2 workers.
fn launcher_per_node(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-launcher");
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/launching.md"))
            .map_err(|e| e.to_string())?;
    let documented = docs
        .lines()
        .find(|l| l.starts_with("srun --ntasks-per-node 1 "))
        .ok_or("no one-launcher-per-node srun line in docs/launching.md")?;
    let command = documented
        .replace("burn-ddp-run", &launcher().display().to_string())
        .replace("--nproc-per-node 4", "--nproc-per-node 2")
        .replace(
            "target/release/examples/mnist --epochs 2 --backend cuda",
            &example("collectives").display().to_string(),
        );
    let mut shell = cluster.command("sh");
    shell.args(["-c", &command]);
    let out = run(shell, &dir, LIMIT);
    let text = stdout(&out);
    check(out.status.success(), || {
        format!(
            "{command}\n{:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    for line in collectives_lines(2) {
        check(text.lines().any(|l| l.trim() == line), || {
            format!("no {line:?} in:\n{text}")
        })?;
    }
    Ok(())
}

fn toy(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-toy");
    let args = ["--epochs", "4", "--loss-precision", "9"];
    let mut srun = cluster.command("srun");
    srun.args(["-n", "2"])
        .arg(example("toy"))
        .args(args)
        .args(["--batch-size", "64"]);
    let out = run(srun, &dir, LIMIT);
    let text = stdout(&out);
    check(out.status.success(), || {
        format!(
            "{:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let mut one = Command::new(example("toy"));
    one.args(args).args(["--batch-size", "128"]);
    let single = run(one, &scratch("slurm-toy-single"), LIMIT);
    let reference = toy_losses(&stdout(&single));
    let distributed = toy_losses(&text);
    check(distributed.len() == 4 && reference.len() == 4, || {
        format!("{text}\n{}", stdout(&single))
    })?;
    for ((epoch, a), (_, b)) in distributed.iter().zip(&reference) {
        check(relative(*a, *b) < 1e-5, || {
            format!("epoch {epoch}: srun 2 x 64 gives {a}, one process x 128 {b}")
        })?;
    }
    Ok(())
}

/// The `#!/bin/bash` block of docs/launching.md's Slurm section.
fn documented_job_script() -> Result<String, String> {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/launching.md"))
            .map_err(|e| e.to_string())?;
    let section = docs
        .split("\n## Slurm")
        .nth(1)
        .ok_or("no Slurm section in docs/launching.md")?;
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .ok_or("no job script in docs/launching.md's Slurm section")?;
    Ok(block.to_string())
}

/// The documented script with this bed's resources (one node, two tasks, no
/// GPUs) and the toy trainer as the program; the rest runs as written.
fn sbatch(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-sbatch");
    let script = documented_job_script()?;
    let toy = example("toy");
    let adapted: Vec<String> = script
        .lines()
        .filter(|line| !line.starts_with("#SBATCH --gpus"))
        .map(|line| {
            if line.starts_with("#SBATCH --nodes=") {
                "#SBATCH --nodes=1".to_string()
            } else if line.starts_with("#SBATCH --ntasks-per-node=") {
                "#SBATCH --ntasks-per-node=2".to_string()
            } else if line.starts_with("srun ") {
                format!("srun {} --epochs 2", toy.display())
            } else {
                line.to_string()
            }
        })
        .collect();
    check(
        adapted.first().is_some_and(|l| l.starts_with("#!"))
            && adapted.iter().filter(|l| l.starts_with("srun ")).count() == 1,
        || format!("unexpected job script:\n{script}"),
    )?;
    let path = dir.join("job.sh");
    std::fs::write(&path, adapted.join("\n") + "\n").map_err(|e| e.to_string())?;
    let mut sbatch = cluster.command("sbatch");
    sbatch.args(["--wait", "--output", "job-%j.out"]).arg(&path);
    let out = run(sbatch, &dir, LIMIT);
    let logs: String = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("job-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    check(out.status.success(), || {
        format!(
            "sbatch --wait: {:?}\n{}\n{}\njob output:\n{logs}",
            out.status,
            stdout(&out),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    check(
        toy_losses(&logs).len() == 2 && logs.matches("starting training").count() == 2,
        || format!("job output:\n{logs}"),
    )
}

/// A job step of the toy trainer that trains until stopped, its output read
/// as it comes.
struct Step {
    srun: Child,
    output: std::sync::Arc<std::sync::Mutex<String>>,
    marker: String,
}

impl Step {
    fn start(cluster: &SlurmCluster, dir: &Path) -> Result<Self, String> {
        // A folder name unique to this step marks its tasks' command lines.
        let marker = dir.display().to_string();
        let mut srun = cluster.command("srun");
        srun.args(["-n", "2", "--label"])
            .arg(example("toy"))
            .args(["--epochs", "100000", "--checkpoint-dir", &marker])
            .args(["--save-interval", "1000000"])
            .env("BURN_DDP_TIMEOUT_SECS", "60")
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut srun = srun.spawn().map_err(|e| format!("srun: {e}"))?;
        let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        for pipe in [
            Box::new(srun.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(srun.stderr.take().unwrap()),
        ] {
            let output = std::sync::Arc::clone(&output);
            std::thread::spawn(move || {
                let mut pipe = pipe;
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    output
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let mut step = Self {
            srun,
            output,
            marker,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !step.text().contains("Epoch 1/") {
            if Instant::now() > deadline || step.srun.try_wait().ok().flatten().is_some() {
                let _ = step.srun.kill();
                return Err(format!("the step did not train:\n{}", step.text()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(step)
    }

    fn text(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// The job this step belongs to (from its tasks' environment, so a job
    /// of an earlier case still completing in the queue does not confuse it).
    fn job_id(&self) -> Option<String> {
        let (_, pid) = *self.tasks().first()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        environ.split(|b| *b == 0).find_map(|var| {
            Some(
                String::from_utf8_lossy(var)
                    .strip_prefix("SLURM_JOB_ID=")?
                    .to_string(),
            )
        })
    }

    /// Pids of this step's tasks, by rank.
    fn tasks(&self) -> Vec<(usize, i32)> {
        let mut tasks = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(&self.marker) {
                continue;
            }
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let rank = environ.split(|b| *b == 0).find_map(|var| {
                String::from_utf8_lossy(var)
                    .strip_prefix("SLURM_PROCID=")?
                    .parse()
                    .ok()
            });
            if let Some(rank) = rank {
                tasks.push((rank, pid));
            }
        }
        tasks.sort();
        tasks
    }

    /// Waits for srun and every task to be gone; how long it took.
    fn wait_gone(&mut self, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let srun_done = self.srun.try_wait().ok().flatten().is_some();
            if srun_done && self.tasks().is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                let left = self.tasks();
                let _ = self.srun.kill();
                for (_, pid) in &left {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                return Err(format!(
                    "after {limit:?}: srun {}, tasks left {left:?}\n{}",
                    if srun_done { "ended" } else { "still running" },
                    self.text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Step {
    /// A case that failed half-way leaves nothing training behind.
    fn drop(&mut self) {
        for (_, pid) in self.tasks() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.srun.kill();
        let _ = self.srun.wait();
    }
}

/// Segment files in /dev/shm made by any of `pids`.
fn segments_of(pids: &[i32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            pids.iter()
                .any(|pid| name.starts_with(&format!("burn-ddp-{pid}-")))
        })
        .collect()
}

fn scancel(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-scancel");
    let mut step = Step::start(cluster, &dir)?;
    let tasks = step.tasks();
    check(tasks.len() == 2, || format!("tasks {tasks:?}"))?;
    let job = step.job_id().ok_or("the tasks carry no SLURM_JOB_ID")?;
    let out = cluster
        .command("scancel")
        .arg(&job)
        .output()
        .map_err(|e| e.to_string())?;
    check(out.status.success(), || format!("scancel: {out:?}"))?;
    let took = step.wait_gone(Duration::from_secs(5))?;
    let pids: Vec<i32> = tasks.iter().map(|(_, pid)| *pid).collect();
    let left = segments_of(&pids);
    check(left.is_empty(), || format!("left in /dev/shm: {left:?}"))?;
    check(
        cluster.wait_for_job_end(&job, Duration::from_secs(10)),
        || format!("job {job} still queued"),
    )?;
    eprintln!("      tasks gone {took:?} after scancel");
    Ok(())
}

fn killed_task(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-killed");
    let mut step = Step::start(cluster, &dir)?;
    let tasks = step.tasks();
    check(tasks.len() == 2, || format!("tasks {tasks:?}"))?;
    let (_, victim) = tasks[1];
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let took = step.wait_gone(Duration::from_secs(5))?;
    let text = step.text();
    // Rank 0 ends by itself, naming the rank that died.
    check(
        text.lines()
            .any(|l| l.starts_with("0:") && l.contains("rank 1")),
        || format!("rank 0 did not name rank 1:\n{text}"),
    )?;
    let pids: Vec<i32> = tasks.iter().map(|(_, pid)| *pid).collect();
    let left = segments_of(&pids);
    check(left.is_empty(), || format!("left in /dev/shm: {left:?}"))?;
    eprintln!("      every task gone {took:?} after the SIGKILL");
    Ok(())
}
