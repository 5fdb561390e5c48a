//! burn-ddp programs started by a real Slurm (munged, slurmctld and slurmd
//! from the test bed; four gres "GPUs" per node): `srun` with no launcher and
//! no `MASTER_ADDR` (rank 0 hosts the store on the step's first node), one
//! burn-ddp-run per node, `scancel` and a killed task ending every other task
//! with nothing left behind, on one node (this host); on two nodes (network
//! namespace machines, each its own host name and `/dev/shm`) the
//! collectives, which GPU each rank takes under `--gpus-per-task` and
//! `--gpus-per-node`, and `sbatch` of the job script docs/launching.md shows.
//! A test per cluster; its cases share the cluster and run one after the
//! other, and the two tests take turns.

use burn_ddp_testkit::programs::{example, launcher, relative, run, scratch, stdout, toy_losses};
use burn_ddp_testkit::{Machines, SlurmCluster};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

/// One cluster at a time: the cases time how fast tasks end, which another
/// cluster's jobs on the same two cores would distort.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// A named check on the shared cluster.
type Case = (&'static str, fn(&SlurmCluster) -> Result<(), String>);

#[test]
fn programs_under_srun_on_one_node() {
    let _turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = SlurmCluster::start().unwrap() else {
        return;
    };
    run_cases(
        &cluster,
        &[
            (
                "srun -n 2 runs the collectives, a job token exported",
                collectives,
            ),
            (
                "a task with another job token is refused",
                a_task_with_another_token_is_refused,
            ),
            ("burn-ddp-run inside an allocation", launcher_per_node),
            ("srun -n 2 toy equals one process with the whole batch", toy),
            ("scancel ends every task", scancel),
            ("a task killed with SIGKILL ends the others", killed_task),
        ],
    );
}

#[test]
fn programs_under_srun_and_sbatch_on_two_nodes() {
    let _turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(machines) = Machines::create(2).unwrap() else {
        return;
    };
    let Some(cluster) = SlurmCluster::on_machines(&machines).unwrap() else {
        return;
    };
    run_cases(
        &cluster,
        &[
            (
                "srun -N 2 --ntasks-per-node 2 runs the collectives",
                collectives_on_two_nodes,
            ),
            (
                "--gpus-per-task 1 gives every rank its own GPU",
                gpus_per_task,
            ),
            (
                "--gpus-per-node 2 gives every rank its own GPU",
                gpus_per_node,
            ),
            (
                "burn-ddp-run per node maps local ranks to GPUs",
                launchers_per_node_with_gpus,
            ),
            ("sbatch runs the documented job script as written", sbatch),
            (
                "a task killed on the second node ends every task",
                killed_task_on_the_second_node,
            ),
        ],
    );
}

fn run_cases(cluster: &SlurmCluster, cases: &[Case]) {
    let mut failed = Vec::new();
    for (name, case) in cases {
        let started = Instant::now();
        match case(cluster) {
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

/// The job token as docs/launching.md's job script sets it: exported once,
/// passed on to every task by srun.
const TOKEN: &str = "3f9c0b7e5a1d42c8b6e0f1a2d3c4b5a6";

fn collectives(cluster: &SlurmCluster) -> Result<(), String> {
    collectives_with(cluster, &["-n", "2"], 2)
}

/// A task holding another token than the job's is refused by rank 0's store
/// at once, naming the variable, and the step ends.
fn a_task_with_another_token_is_refused(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-token");
    let mut srun = cluster.command_in(&dir, "srun");
    srun.args(["-n", "2", "--label", "--kill-on-bad-exit=1", "sh", "-c"])
        .arg(format!(
            "[ \"$SLURM_PROCID\" = 1 ] && export BURN_DDP_JOB_TOKEN=stranger; exec {}",
            example("collectives").display()
        ))
        .env("BURN_DDP_JOB_TOKEN", TOKEN)
        .env("BURN_DDP_TIMEOUT_SECS", "60");
    let started = Instant::now();
    let out = run(srun, &dir, LIMIT);
    let took = started.elapsed();
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    check(!out.status.success(), || {
        format!("the step succeeded:\n{text}")
    })?;
    check(
        text.lines()
            .any(|l| l.starts_with("1:") && l.contains("BURN_DDP_JOB_TOKEN")),
        || format!("rank 1 was not refused naming BURN_DDP_JOB_TOKEN:\n{text}"),
    )?;
    check(!text.contains("1: 1 all_reduce"), || {
        format!("rank 1 took part:\n{text}")
    })?;
    check(took < Duration::from_secs(20), || {
        format!("took {took:?}, not at once:\n{text}")
    })
}

fn collectives_on_two_nodes(cluster: &SlurmCluster) -> Result<(), String> {
    collectives_with(cluster, &["-N", "2", "--ntasks-per-node", "2"], 4)
}

/// `srun <srun_args> collectives` with the job token exported, every one of
/// the `world` ranks' values checked.
fn collectives_with(
    cluster: &SlurmCluster,
    srun_args: &[&str],
    world: usize,
) -> Result<(), String> {
    let dir = scratch("slurm-collectives");
    let mut srun = cluster.command_in(&dir, "srun");
    srun.args(srun_args)
        .arg(example("collectives"))
        .env("BURN_DDP_JOB_TOKEN", TOKEN);
    let out = run(srun, &dir, LIMIT);
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    check(out.status.success(), || {
        format!("{:?}\n{text}\n{stderr}", out.status)
    })?;
    for line in collectives_lines(world) {
        check(text.lines().any(|l| l.trim() == line), || {
            format!("no {line:?} in:\n{text}")
        })?;
    }
    Ok(())
}

/// docs/launching.md's one-launcher-per-node line (`srun --ntasks-per-node 1`
/// running burn-ddp-run with the allocation's node count, index and first
/// node), with `srun_args` added (what an allocation would give), 2 workers
/// per node and `program` for the documented trainer.
fn documented_launcher_line(srun_args: &str, program: &Path) -> Result<String, String> {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/launching.md"))
            .map_err(|e| e.to_string())?;
    let documented = docs
        .lines()
        .find(|l| l.starts_with("srun --ntasks-per-node 1 "))
        .ok_or("no one-launcher-per-node srun line in docs/launching.md")?;
    let trainer = "target/release/examples/mnist --epochs 2 --backend cuda";
    check(
        documented.contains("--nproc-per-node 4") && documented.contains(trainer),
        || format!("unexpected launcher line: {documented}"),
    )?;
    Ok(documented
        .replacen("srun ", &format!("srun {srun_args} "), 1)
        .replace("burn-ddp-run", &launcher().display().to_string())
        .replace("--nproc-per-node 4", "--nproc-per-node 2")
        .replace(trainer, &program.display().to_string()))
}

/// The one-launcher-per-node line on the bed's one node with 2 workers.
fn launcher_per_node(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-launcher");
    let command = documented_launcher_line("", &example("collectives"))?;
    let mut shell = cluster.command_in(&dir, "sh");
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

/// Runs `shell_command` (an srun line starting whereami) on the cluster with
/// `env` and returns each rank's `key=value` fields, by rank.
fn whereami(
    cluster: &SlurmCluster,
    shell_command: &str,
    env: &[(&str, &str)],
) -> Result<BTreeMap<usize, BTreeMap<String, String>>, String> {
    let dir = scratch("slurm-whereami");
    let mut shell = cluster.command_in(&dir, "sh");
    shell.args(["-c", shell_command]).envs(env.iter().copied());
    let out = run(shell, &dir, LIMIT);
    whereami_fields(&stdout(&out)).map_err(|why| {
        format!(
            "{shell_command}\n{:?}\n{why}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Each rank's `key=value` fields from whereami's lines in `text`, by rank.
fn whereami_fields(text: &str) -> Result<BTreeMap<usize, BTreeMap<String, String>>, String> {
    let mut ranks = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("rank=")) {
        let fields: BTreeMap<String, String> = line
            .split_whitespace()
            .filter_map(|field| field.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let rank = fields
            .get("rank")
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| format!("no rank in {line:?}"))?;
        if ranks.insert(rank, fields).is_some() {
            return Err(format!("rank {rank} printed twice:\n{text}"));
        }
    }
    Ok(ranks)
}

/// `per_node` ranks on each of the two nodes, in order, that found the store
/// on the first node, hold the job token, and each took a GPU no other rank
/// of its node took.
fn check_placement(
    cluster: &SlurmCluster,
    ranks: &BTreeMap<usize, BTreeMap<String, String>>,
    per_node: usize,
    launcher: &str,
) -> Result<(), String> {
    let nodes = cluster.nodes();
    let world = 2 * per_node;
    let shown = || format!("{ranks:#?}");
    check(ranks.keys().copied().eq(0..world), || {
        format!("not ranks 0..{world}: {}", shown())
    })?;
    let mut gpus = BTreeSet::new();
    for (&rank, fields) in ranks {
        let field = |key: &str| fields.get(key).map(String::as_str).unwrap_or("");
        let expected = [
            ("world_size", world.to_string()),
            ("local_world_size", per_node.to_string()),
            ("local_rank", (rank % per_node).to_string()),
            ("host", nodes[rank / per_node].0.to_string()),
            ("launcher", launcher.to_string()),
            ("store_resolves", nodes[0].1.to_string()),
            ("job_token", "set".to_string()),
            ("gpu_shared", "false".to_string()),
        ];
        for (key, value) in expected {
            check(field(key) == value, || {
                format!(
                    "rank {rank}: {key}={}, expected {value}\n{}",
                    field(key),
                    shown()
                )
            })?;
        }
        check(
            field("store").starts_with(&format!("{}:", nodes[0].0)),
            || {
                format!(
                    "rank {rank}: store {} is not on {}",
                    field("store"),
                    nodes[0].0
                )
            },
        )?;
        // The physical GPU: the CUDA_VISIBLE_DEVICES entry the chosen ordinal names.
        let gpu = field("gpu_listed_as");
        check(!gpu.is_empty(), || {
            format!("rank {rank} took no GPU\n{}", shown())
        })?;
        check(
            gpus.insert((field("host").to_string(), gpu.to_string())),
            || {
                format!(
                    "rank {rank} took GPU {gpu} of {}, as another rank did\n{}",
                    field("host"),
                    shown()
                )
            },
        )?;
    }
    Ok(())
}

fn gpus_per_task(cluster: &SlurmCluster) -> Result<(), String> {
    let program = example("whereami");
    let line = format!(
        "srun -N 2 --ntasks-per-node 2 --gpus-per-task 1 {}",
        program.display()
    );
    let ranks = whereami(cluster, &line, &[("BURN_DDP_JOB_TOKEN", TOKEN)])?;
    check_placement(cluster, &ranks, 2, "srun")?;
    // Each task sees only its own GPU, which is its cuda:0.
    for (rank, fields) in &ranks {
        check(
            fields.get("gpus_visible").map(String::as_str) == Some("1")
                && fields.get("gpu").map(String::as_str) == Some("cuda:0"),
            || format!("rank {rank}: {fields:?}"),
        )?;
    }
    Ok(())
}

fn gpus_per_node(cluster: &SlurmCluster) -> Result<(), String> {
    let program = example("whereami");
    let line = format!(
        "srun -N 2 --ntasks-per-node 2 --gpus-per-node 2 {}",
        program.display()
    );
    let ranks = whereami(cluster, &line, &[("BURN_DDP_JOB_TOKEN", TOKEN)])?;
    check_placement(cluster, &ranks, 2, "srun")?;
    // Both tasks of a node see both of its GPUs; local rank i takes cuda:i.
    for (rank, fields) in &ranks {
        check(
            fields.get("gpus_visible").map(String::as_str) == Some("2")
                && fields.get("gpu") == Some(&format!("cuda:{}", rank % 2)),
            || format!("rank {rank}: {fields:?}"),
        )?;
    }
    Ok(())
}

/// One burn-ddp-run per node (the documented line) whose task has two GPUs:
/// its workers inherit them and take one each by LOCAL_RANK.
fn launchers_per_node_with_gpus(cluster: &SlurmCluster) -> Result<(), String> {
    let line = documented_launcher_line("-N 2 --gpus-per-node 2", &example("whereami"))?;
    let ranks = whereami(cluster, &line, &[("BURN_DDP_JOB_TOKEN", TOKEN)])?;
    check_placement(cluster, &ranks, 2, "burn-ddp-run")
}

fn toy(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-toy");
    let args = ["--epochs", "4", "--loss-precision", "9"];
    let mut srun = cluster.command_in(&dir, "srun");
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

/// The documented script, its srun line's program replaced by `program`,
/// submitted with `sbatch --wait` in `dir`; the job's output.
fn sbatch_documented(cluster: &SlurmCluster, dir: &Path, program: &str) -> Result<String, String> {
    let script = documented_job_script()?;
    let adapted: Vec<String> = script
        .lines()
        .map(|line| {
            if line.starts_with("srun ") {
                format!("srun {program}")
            } else {
                line.to_string()
            }
        })
        .collect();
    check(
        adapted.first().is_some_and(|l| l.starts_with("#!"))
            && adapted.iter().filter(|l| l.starts_with("srun ")).count() == 1
            && adapted.contains(&"#SBATCH --nodes=2".to_string())
            && adapted.contains(&"#SBATCH --ntasks-per-node=4".to_string())
            && adapted.contains(&"#SBATCH --gpus-per-node=4".to_string()),
        || {
            format!(
                "unexpected job script (this test expects 2 nodes x 4 tasks x 4 GPUs):\n{script}"
            )
        },
    )?;
    let path = dir.join("job.sh");
    std::fs::write(&path, adapted.join("\n") + "\n").map_err(|e| e.to_string())?;
    let mut sbatch = cluster.command_in(dir, "sbatch");
    sbatch
        .args(["--wait", "--output", "job-%j.out"])
        .arg(&path)
        .env_remove("BURN_DDP_JOB_TOKEN");
    let out = run(sbatch, dir, LIMIT);
    let logs: String = std::fs::read_dir(dir)
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
    Ok(logs)
}

/// The documented script on the two-node bed (two nodes, four tasks and four
/// GPUs each), as written but for its program: whereami shows every task
/// with all four of its node's GPUs, one of its own taken, and the token
/// the script exported; the toy trainer trains on all eight ranks.
fn sbatch(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-sbatch-whereami");
    let logs = sbatch_documented(cluster, &dir, &example("whereami").display().to_string())?;
    let ranks = whereami_fields(&logs)?;
    check_placement(cluster, &ranks, 4, "srun")?;
    for (rank, fields) in &ranks {
        check(
            fields.get("cuda_visible_devices").map(String::as_str) == Some("0,1,2,3"),
            || format!("rank {rank}: {fields:?}"),
        )?;
    }
    let dir = scratch("slurm-sbatch-toy");
    let toy = format!("{} --epochs 2", example("toy").display());
    let logs = sbatch_documented(cluster, &dir, &toy)?;
    check(
        toy_losses(&logs).len() == 2 && logs.matches("starting training").count() == 8,
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
    /// `srun <srun_args> --label toy ...` in `dir`.
    fn start(cluster: &SlurmCluster, dir: &Path, srun_args: &[&str]) -> Result<Self, String> {
        // A folder name unique to this step marks its tasks' command lines.
        let marker = dir.display().to_string();
        let mut srun = cluster.command_in(dir, "srun");
        srun.args(srun_args)
            .arg("--label")
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

/// Segment files in node `node`'s /dev/shm made by any of `pids`.
fn segments_of(cluster: &SlurmCluster, node: usize, pids: &[i32]) -> Vec<String> {
    let listed = cluster
        .on_node(node, "ls")
        .arg("/dev/shm")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    listed
        .split_whitespace()
        .filter(|name| {
            pids.iter()
                .any(|pid| name.starts_with(&format!("burn-ddp-{pid}-")))
        })
        .map(str::to_string)
        .collect()
}

fn scancel(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-scancel");
    let mut step = Step::start(cluster, &dir, &["-n", "2"])?;
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
    let left = segments_of(cluster, 0, &pids);
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
    let mut step = Step::start(cluster, &dir, &["-n", "2"])?;
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
    let left = segments_of(cluster, 0, &pids);
    check(left.is_empty(), || format!("left in /dev/shm: {left:?}"))?;
    eprintln!("      every task gone {took:?} after the SIGKILL");
    Ok(())
}

/// Rank 3, on the second node, killed with SIGKILL: every task on both nodes
/// ends within 5 s, the dead rank is named, and neither node's /dev/shm keeps
/// a segment.
fn killed_task_on_the_second_node(cluster: &SlurmCluster) -> Result<(), String> {
    let dir = scratch("slurm-killed-two-nodes");
    let mut step = Step::start(cluster, &dir, &["-N", "2", "--ntasks-per-node", "2"])?;
    let tasks = step.tasks();
    check(tasks.len() == 4, || format!("tasks {tasks:?}"))?;
    let pids: Vec<i32> = tasks.iter().map(|(_, pid)| *pid).collect();
    // The two ranks of each node share memory there (the segment is unlinked
    // once mapped, so it shows in the tasks' maps, not in /dev/shm).
    for (rank, pid) in &tasks {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        check(maps.contains("/dev/shm/burn-ddp-"), || {
            format!("rank {rank} maps no shared-memory segment")
        })?;
    }
    let (_, victim) = tasks[3];
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let took = step.wait_gone(Duration::from_secs(5))?;
    let text = step.text();
    // A surviving rank (srun's label) names the dead one.
    check(
        text.lines().any(|l| {
            ["0:", "1:", "2:"].iter().any(|label| l.starts_with(label)) && l.contains("rank 3")
        }),
        || format!("no surviving rank named rank 3:\n{text}"),
    )?;
    for node in 0..2 {
        let left = segments_of(cluster, node, &pids);
        check(left.is_empty(), || {
            format!("left in node {node}'s /dev/shm: {left:?}")
        })?;
    }
    eprintln!("      every task on both nodes gone {took:?} after the SIGKILL");
    Ok(())
}
