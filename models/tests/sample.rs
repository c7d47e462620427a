//! The sampler: greedy is the arg max; a seed gives the same tokens again; top-k and
//! top-p keep only the tokens they should; sampled frequencies follow the softmax.

use ndfuse_models::{Sampler, Sampling};

fn logits() -> Vec<f32> {
    vec![1.0, 3.0, 2.0, 3.0, -1.0, 0.5]
}

#[test]
fn greedy_is_the_first_arg_max() {
    let mut s = Sampler::new(Sampling::default());
    assert_eq!(s.next(&logits()), 1);
    assert_eq!(s.next(&[f32::NAN, 0.0, 2.0]), 2);
}

#[test]
fn sampling_is_seeded_and_filtered() {
    let draw = |settings: Sampling, n: usize| {
        let mut s = Sampler::new(settings);
        (0..n).map(|_| s.next(&logits())).collect::<Vec<u32>>()
    };
    let warm = Sampling {
        temperature: 1.0,
        seed: 42,
        ..Sampling::default()
    };
    assert_eq!(
        draw(warm.clone(), 50),
        draw(warm.clone(), 50),
        "the same seed"
    );
    assert_ne!(
        draw(warm.clone(), 50),
        draw(
            Sampling {
                seed: 43,
                ..warm.clone()
            },
            50
        )
    );
    // top-k 2 keeps the two largest logits (ids 1 and 3, tied).
    let k2 = draw(
        Sampling {
            top_k: 2,
            ..warm.clone()
        },
        400,
    );
    assert!(k2.iter().all(|&t| t == 1 || t == 3), "{k2:?}");
    assert!(k2.contains(&1) && k2.contains(&3));
    // top-p 0.5: ids 1 and 3 hold 2 * e^3 / sum ~ 0.77 of the mass; id 1 alone 0.39, so
    // the nucleus is {1, 3}.
    let p = draw(
        Sampling {
            top_p: 0.5,
            ..warm.clone()
        },
        400,
    );
    assert!(p.iter().all(|&t| t == 1 || t == 3), "{p:?}");
    // Frequencies follow the softmax at temperature 1 (4000 draws, 4 sigma).
    let n = 4000;
    let all = draw(warm, n);
    let z: f64 = logits().iter().map(|&l| f64::from(l).exp()).sum();
    for (id, &l) in logits().iter().enumerate() {
        let p = f64::from(l).exp() / z;
        let got = all.iter().filter(|&&t| t as usize == id).count() as f64 / n as f64;
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (got - p).abs() <= 4.0 * sigma + 1e-9,
            "id {id}: {got} vs {p}"
        );
    }
}
