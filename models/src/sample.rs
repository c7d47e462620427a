//! Choosing the next token from logits: greedy, or sampled with a temperature, top-k
//! and top-p (nucleus) filtering, from a seeded generator (the same seed gives the same
//! text). The filters follow Hugging Face's `generate`: temperature first, then top-k,
//! then top-p keeps the smallest set of the most likely tokens whose probabilities
//! reach `p` (the most likely one always kept).

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 is greedy (the arg max, the lowest id on ties).
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to `p` (1: all).
    pub top_p: f64,
    /// The generator's seed.
    pub seed: u64,
}

impl Default for Sampling {
    /// Greedy.
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// A sampler: the settings and the generator's state.
#[derive(Clone, Debug)]
pub struct Sampler {
    settings: Sampling,
    state: u64,
}

impl Sampler {
    /// A sampler seeded by `settings.seed`.
    pub fn new(settings: Sampling) -> Sampler {
        let state = settings.seed ^ 0x9e37_79b9_7f4a_7c15;
        Sampler { settings, state }
    }

    /// splitmix64: a uniform draw in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token of `logits`.
    pub fn next(&mut self, logits: &[f32]) -> u32 {
        let s = &self.settings;
        if s.temperature <= 0.0 || s.top_k == 1 {
            return argmax(logits);
        }
        // Candidates by decreasing logit (ties by id), cut to top-k.
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if s.top_k > 0 {
            order.truncate(s.top_k);
        }
        let top = f64::from(logits[order[0] as usize]);
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i as usize]) - top) / s.temperature).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if s.top_p < 1.0 {
            let mut mass = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                mass += p;
                if mass >= s.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            order.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        let mut u = self.uniform();
        for (&id, &p) in order.iter().zip(&probs) {
            if u < p {
                return id;
            }
            u -= p;
        }
        *order.last().unwrap_or(&0)
    }
}

/// The index of the largest logit (the first on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}
