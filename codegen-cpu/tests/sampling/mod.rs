//! Sampled f32 inputs of the math suites (`vmath`, `wide_math`): a small deterministic
//! generator, log-uniform magnitudes of both signs, and the edge cases every op is
//! tried on.
#![allow(dead_code)] // each test binary uses a different part

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// An f32 of random sign and mantissa whose binary exponent is uniform in
    /// `[emin, emax]` (below -126: subnormals).
    pub fn log_uniform(&mut self, emin: i32, emax: i32) -> f32 {
        let r = self.next();
        let span = (emax - emin + 1) as u64;
        let e = emin + ((r >> 32) % span) as i32;
        let mant = (r & 0x007F_FFFF) as u32;
        let v = if e < -126 {
            // Subnormal: the mantissa shifted down to the exponent.
            f32::from_bits((mant | 0x0080_0000) >> (-126 - e).min(24))
        } else {
            f32::from_bits((((e + 127) as u32) << 23) | mant)
        };
        if (r >> 31) & 1 == 1 {
            -v
        } else {
            v
        }
    }
}

pub fn next_up(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}

pub fn next_down(x: f32) -> f32 {
    f32::from_bits(x.to_bits() - 1)
}

/// Zeros, infinities, NaNs, subnormals, the extremes of the range, and the thresholds
/// where the math changes method or saturates, each with its neighbours and negation.
pub fn edge_cases() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(1),
        f32::from_bits(0x007F_FFFF),
        f32::MIN_POSITIVE,
        f32::MAX,
        1.0,
    ];
    let thresholds = [
        88.722_83,                       // exp overflows above
        87.0,                            // exp's fast path ends
        -87.336_55,                      // exp becomes subnormal below
        -103.278_93,                     // exp reaches the smallest subnormal
        -103.972_08,                     // exp rounds to 0 below
        -104.0,                          // exp's clamp
        89.0,                            // exp's upper clamp
        88.376_26,                       // n = 128 in expm1
        -17.328_68,                      // expm1 rounds to -1
        -20.0,                           // expm1's clamp
        2.980_232_2e-8,                  // 2^-25: expm1 returns x below
        5.960_464_5e-8,                  // 2^-24: log1p returns x below
        9.0,                             // tanh is still below 1
        9.010_913,                       // tanh saturates
        9.1,                             // tanh's clamp
        0.549_306_1,                     // tanh switches method
        1.0,                             // erf switches method
        4.0,                             // erf saturates
        0.346_573_6,                     // ln2/2: the reduction's edge
        std::f32::consts::FRAC_1_SQRT_2, // log's mantissa edge
        std::f32::consts::SQRT_2,
        16_777_216.0, // 2^24: sin/cos leave the inline path
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        -1.0,
        0.5,
        2.0,
    ];
    for t in thresholds {
        for x in [t, next_up(t), next_down(t)] {
            v.push(x);
            v.push(-x);
        }
    }
    for x in [f32::from_bits(1), f32::MIN_POSITIVE, f32::MAX] {
        v.push(-x);
        v.push(next_down(x));
    }
    v
}

/// The edge cases, then `samples` inputs: half over all magnitudes, half over
/// 2^emin..2^emax.
pub fn inputs(seed: u64, (emin, emax): (i32, i32), samples: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut v = edge_cases();
    for i in 0..samples {
        v.push(if i % 2 == 0 {
            rng.log_uniform(-149, 127)
        } else {
            rng.log_uniform(emin, emax)
        });
    }
    v
}
