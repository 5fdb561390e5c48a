//! What Slurm's variables say beyond rank and world size: how many tasks run
//! on this node, and where rank 0 runs (the first node of the step), so a job
//! started with `srun` needs no `MASTER_ADDR`.

/// The number of tasks on node `node` from a tasks-per-node list as Slurm
/// writes it (`SLURM_STEP_TASKS_PER_NODE`, `SLURM_TASKS_PER_NODE`): counts
/// separated by commas, `N(xK)` for `K` nodes of `N`: `"2(x3),1"` is 2, 2, 2, 1.
pub(super) fn tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut first_node = 0;
    for entry in list.split(',') {
        let entry = entry.trim();
        let (count, repeat) = match entry.split_once("(x") {
            Some((count, repeat)) => (count, repeat.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (entry, 1),
        };
        let count = count.parse::<usize>().ok()?;
        if node < first_node + repeat {
            return Some(count);
        }
        first_node += repeat;
    }
    None
}

/// The first host of a Slurm host list (`SLURM_STEP_NODELIST`):
/// `"gpu[07-09,12],cpu1"` is `gpu07`, `"node3"` is `node3`. Slurm places
/// task 0 on the first node of the step.
pub(super) fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    // The first host ends at the first comma outside brackets.
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let host = expand_first(&list[..end])?;
    (!host.is_empty()).then_some(host)
}

/// The first name one host pattern stands for: each `[...]` becomes its first
/// number, zero padding kept.
fn expand_first(pattern: &str) -> Option<String> {
    match pattern.split_once('[') {
        None => (!pattern.contains(']')).then(|| pattern.to_string()),
        Some((prefix, rest)) => {
            let (ranges, suffix) = rest.split_once(']')?;
            let first = ranges.split(',').next()?.split('-').next()?;
            Some(format!("{prefix}{first}{}", expand_first(suffix)?))
        }
    }
}

/// The store's port for an srun step when `MASTER_PORT` is not set: one per
/// job and step (`20000 + (8 × job + step) mod 12000`), so jobs sharing a node
/// and steps running side by side in one job do not collide, and below
/// Linux's ephemeral ports (32768 and up), which outgoing connections take.
pub(super) fn port_for_step(job_id: &str, step_id: &str) -> Option<u16> {
    let job: u64 = job_id.trim().parse().ok()?;
    let step: u64 = step_id.trim().parse().ok()?;
    Some(20_000 + ((job * 8 + step) % 12_000) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_per_node_lists() {
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
        assert_eq!(tasks_on_node("3,1", 1), Some(1));
        assert_eq!(tasks_on_node("x", 0), None);
    }

    #[test]
    fn first_hosts() {
        assert_eq!(first_host("node3").as_deref(), Some("node3"));
        assert_eq!(first_host("gpu[07-09,12],cpu1").as_deref(), Some("gpu07"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(
            first_host("rack[2,4]-n[01-02]").as_deref(),
            Some("rack2-n01")
        );
        assert_eq!(first_host("broken[1-2").as_deref(), None);
        assert_eq!(first_host("").as_deref(), None);
    }

    #[test]
    fn ports_follow_the_job_and_step() {
        assert_eq!(port_for_step("7", "0"), Some(20_056));
        assert_eq!(port_for_step("7", "1"), Some(20_057));
        assert_eq!(port_for_step("1507", "0"), Some(20_056));
        assert!(port_for_step("123456789", "3").is_some_and(|p| p < 32_768));
        assert_eq!(port_for_step("x", "0"), None);
    }
}
