//! The 32-bit Mersenne Twister, seeded as PyTorch's CPU generator seeds it.
//!
//! `torch.Generator().manual_seed(s)` keeps the low 32 bits of `s` and runs the
//! reference MT19937 initialisation; `random()` is one tempered 32-bit output
//! and `random64()` joins two outputs, the first as the high half.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// MT19937 with PyTorch's seeding.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    next: usize,
}

impl Mt19937 {
    /// Seeds like `torch.Generator.manual_seed(seed)`.
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; N];
        state[0] = seed as u32;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, next: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mut value = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                value ^= MATRIX_A;
            }
            self.state[i] = value;
        }
        self.next = 0;
    }

    /// The next 32-bit output (`CPUGeneratorImpl::random`).
    pub fn next_u32(&mut self) -> u32 {
        if self.next >= N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Two outputs joined, the first as the high half (`CPUGeneratorImpl::random64`).
    pub fn next_u64(&mut self) -> u64 {
        let high = self.next_u32() as u64;
        let low = self.next_u32() as u64;
        (high << 32) | low
    }
}

/// `torch.randperm(n, generator=g)` on the CPU, for a generator seeded with `seed`.
pub fn randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Mt19937::new(seed);
    // PyTorch keeps its original swap-forward shuffle for n below u32::MAX / 20
    // and uses the inside-out Fisher-Yates with 64-bit draws above, where a
    // 32-bit draw modulo n would be visibly skewed.
    if (n as u64) < (u32::MAX / 20) as u64 {
        let mut perm: Vec<usize> = (0..n).collect();
        for i in 0..n.saturating_sub(1) {
            let z = rng.next_u32() as usize % (n - i);
            perm.swap(i, i + z);
        }
        perm
    } else {
        let mut perm = vec![0usize; n];
        for i in 0..n {
            let z = (rng.next_u64() % (i as u64 + 1)) as usize;
            perm[i] = perm[z];
            perm[z] = i;
        }
        perm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_mt19937_stream() {
        // The C++ standard requires the 10000th output of a default-seeded
        // std::mt19937 (seed 5489) to be 4123659995.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
        // First outputs for seed 5489, from the reference implementation.
        let mut rng = Mt19937::new(5489);
        assert_eq!(rng.next_u32(), 3_499_211_612);
        assert_eq!(rng.next_u32(), 581_869_302);
    }

    #[test]
    fn randperm_matches_torch_for_seed_zero() {
        // torch.manual_seed(0); torch.randperm(10)
        assert_eq!(randperm(10, 0), vec![4, 1, 7, 5, 3, 9, 0, 8, 6, 2]);
    }

    #[test]
    fn seed_keeps_only_the_low_32_bits() {
        assert_eq!(randperm(50, 7), randperm(50, 7 + (1u64 << 32)));
    }

    #[test]
    fn tiny_permutations() {
        assert!(randperm(0, 3).is_empty());
        assert_eq!(randperm(1, 3), vec![0]);
    }
}
