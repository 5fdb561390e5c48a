//! The hook against Burn 0.21's own backward, on random graphs: weight
//! sharing, parameters used at several depths, unused parameters, with and
//! without gradient checkpointing.

use super::*;
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use std::sync::Mutex;

type Ad<C> = Autodiff<NdArray, C>;

const PARAMS: usize = 4;

/// xorshift64: the same graphs on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| self.below(1000) as f32 / 1000.0 - 0.5)
            .collect()
    }
}

/// One op of a random forward pass over values `a`, `b` (indices into the
/// values so far) and parameter `p`.
#[derive(Clone, Copy, Debug)]
enum Op {
    MatmulParam(usize, usize),
    AddParam(usize, usize),
    MulParam(usize, usize),
    Tanh(usize),
    Matmul(usize, usize),
    Add(usize, usize),
    Mul(usize, usize),
}

fn program(rng: &mut Rng, len: usize) -> Vec<Op> {
    (0..len)
        .map(|i| {
            let values = i + 1; // the input, then one value per op
            let (a, b, p) = (rng.below(values), rng.below(values), rng.below(PARAMS));
            match rng.below(7) {
                0 => Op::MatmulParam(a, p),
                1 => Op::AddParam(a, p),
                2 => Op::MulParam(a, p),
                3 => Op::Tanh(a),
                4 => Op::Matmul(a, b),
                5 => Op::Add(a, b),
                _ => Op::Mul(a, b),
            }
        })
        .collect()
}

/// What one backward pass gave: each parameter's gradient (as bits), the
/// level of the other input at each use of a parameter, and the hooks that
/// fired (parameter, level, gradient bits), in firing order.
#[derive(Default)]
struct Pass {
    grads: Vec<Option<Vec<u32>>>,
    uses: Vec<(usize, usize)>,
    fired: Vec<(usize, usize, Vec<u32>)>,
}

fn level<C: CheckpointStrategy>(value: &Tensor<Ad<C>, 2>) -> usize {
    value.clone().into_primitive().tensor().node.order
}

fn bits<B: burn::tensor::backend::Backend>(tensor: Tensor<B, 2>) -> Vec<u32> {
    let data = tensor.into_data();
    data.as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Runs `ops` forward and backward; with `hook_levels`, each parameter whose
/// level is at least 1 goes through one hook at that level, made at its
/// first use.
fn run<C: CheckpointStrategy>(
    ops: &[Op],
    input: &[f32],
    params: &[Vec<f32>],
    hook_levels: Option<&[usize]>,
) -> Pass {
    let device = Default::default();
    let tensor =
        |v: &[f32]| Tensor::<Ad<C>, 2>::from_data(TensorData::new(v.to_vec(), [4, 4]), &device);
    let leaves: Vec<_> = params.iter().map(|p| tensor(p).require_grad()).collect();
    let fired = Arc::new(Mutex::new(Vec::new()));
    let mut through: Vec<Option<Tensor<Ad<C>, 2>>> = vec![None; PARAMS];
    let mut pass = Pass::default();
    let mut values = vec![tensor(input)];
    let mut param = |p: usize, other: &Tensor<Ad<C>, 2>, pass: &mut Pass| {
        pass.uses.push((p, level(other)));
        through[p]
            .get_or_insert_with(|| {
                let Some(&level) = hook_levels.map(|levels| &levels[p]) else {
                    return leaves[p].clone();
                };
                let fired = fired.clone();
                let on_ready: OnReady<NdArray> = Arc::new(move |_, grad| {
                    let seen =
                        Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(grad.clone()));
                    fired.lock().unwrap().push((p, level, bits(seen)));
                    Some(grad)
                });
                let primitive = leaves[p].clone().into_primitive().tensor();
                match hooked::<NdArray, C>(&primitive, level, on_ready) {
                    Some(hook) => Tensor::from_primitive(TensorPrimitive::Float(hook)),
                    None => leaves[p].clone(),
                }
            })
            .clone()
    };
    for op in ops {
        let value = match *op {
            Op::MatmulParam(a, p) => values[a]
                .clone()
                .matmul(param(p, &values[a], &mut pass))
                .tanh(),
            Op::AddParam(a, p) => values[a].clone() + param(p, &values[a], &mut pass),
            Op::MulParam(a, p) => values[a].clone() * param(p, &values[a], &mut pass),
            Op::Tanh(a) => values[a].clone().tanh(),
            Op::Matmul(a, b) => values[a].clone().matmul(values[b].clone()).tanh(),
            Op::Add(a, b) => values[a].clone() + values[b].clone(),
            Op::Mul(a, b) => values[a].clone() * values[b].clone(),
        };
        values.push(value);
    }
    let loss = values[values.len() - 3..]
        .iter()
        .map(|v| v.clone().sum())
        .reduce(|a, b| a + b)
        .unwrap();
    let grads = loss.backward();
    pass.grads = leaves
        .iter()
        .map(|leaf| leaf.grad(&grads).map(bits))
        .collect();
    pass.fired = std::mem::take(&mut *fired.lock().unwrap());
    pass
}

/// The level each parameter's hook goes to: the shallowest other input
/// over its uses.
fn hook_levels(uses: &[(usize, usize)]) -> Vec<usize> {
    let mut levels = vec![usize::MAX; PARAMS];
    for &(p, level) in uses {
        levels[p] = levels[p].min(level);
    }
    levels
}

/// Every parameter's gradient bit for bit as without hooks; every hook
/// fired once, with that final gradient, deepest first. Returns how many
/// hooks fired.
fn check_graph<C: CheckpointStrategy>(seed: u64) -> usize {
    let mut rng = Rng(seed);
    let ops = program(&mut rng, 24);
    let input = rng.values(16);
    let params: Vec<_> = (0..PARAMS).map(|_| rng.values(16)).collect();
    let plain = run::<C>(&ops, &input, &params, None);
    let levels = hook_levels(&plain.uses);
    let hooked = run::<C>(&ops, &input, &params, Some(&levels));
    let context = format!("seed {seed}, levels {levels:?}, program {ops:?}");
    assert_eq!(
        hooked.uses, plain.uses,
        "a hook moved a node's level: {context}"
    );
    assert_eq!(hooked.grads, plain.grads, "gradients differ: {context}");
    for (p, grad) in plain.grads.iter().enumerate() {
        let fired: Vec<_> = hooked.fired.iter().filter(|f| f.0 == p).collect();
        let expected = usize::from(grad.is_some() && (1..usize::MAX).contains(&levels[p]));
        assert_eq!(fired.len(), expected, "parameter {p}: {context}");
        if let Some((_, _, bits)) = fired.first() {
            assert_eq!(
                Some(bits),
                grad.as_ref(),
                "parameter {p}'s hook saw a partial gradient: {context}"
            );
        }
    }
    let order: Vec<usize> = hooked.fired.iter().map(|f| f.1).collect();
    assert!(
        order.windows(2).all(|w| w[0] >= w[1]),
        "hooks fired out of level order {order:?}: {context}"
    );
    hooked.fired.len()
}

#[test]
fn hooked_parameters_get_their_final_gradient_early_and_bit_for_bit() {
    let fired: usize = (1..=300).map(check_graph::<NoCheckpointing>).sum();
    // Not vacuous: most graphs have parameters used deep enough to hook.
    assert!(fired > 300, "{fired} hooks fired over 300 graphs");
}

#[test]
fn hooks_survive_gradient_checkpointing_bit_for_bit() {
    let fired: usize = (1..=300).map(check_graph::<BalancedCheckpointing>).sum();
    assert!(fired > 300, "{fired} hooks fired over 300 graphs");
}

#[test]
fn a_parameter_used_on_the_inputs_directly_gets_no_hook() {
    let device = Default::default();
    let param = Tensor::<Ad<NoCheckpointing>, 2>::ones([2, 2], &device).require_grad();
    let primitive = param.into_primitive().tensor();
    assert!(
        hooked::<NdArray, NoCheckpointing>(&primitive, 0, Arc::new(|_, grad| Some(grad))).is_none()
    );
    let untracked = Tensor::<Ad<NoCheckpointing>, 2>::ones([2, 2], &device)
        .into_primitive()
        .tensor();
    assert!(
        hooked::<NdArray, NoCheckpointing>(&untracked, 3, Arc::new(|_, grad| Some(grad))).is_none()
    );
}
