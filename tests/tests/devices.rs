//! Multi-device: a device set of two CPU devices (each its own pool of one worker
//! thread) and fake devices, without a GPU. Batches are placed GPUs first, then CPUs;
//! threads are bound explicitly or round-robin under `allow_multi_gpu`; a device that
//! runs out of memory hands the evaluation to the next one by priority, which is logged
//! and recorded; `to_device` copies on the device and records it. With a GPU (or
//! `NDFUSE_REQUIRE_CUDA=1`), every CUDA ordinal runs on its own device.

use ndfuse::{
    BackendKind, Context, CpuDevice, Device, DeviceId, DeviceKind, DeviceMove, DeviceSet, Tensor,
};
use ndfuse_ir::{Graph, HostArray};
use ndfuse_runtime::{AllocError, Config, DeviceError, Evaluation, Inputs, RuntimeError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A configuration that ignores the process's file and environment.
fn config(set: &[(&str, &str)]) -> Config {
    let mut b = Config::builder()
        .config_file(None)
        .environment(Vec::<(String, String)>::new());
    for (k, v) in set {
        b = b.set(k, *v);
    }
    b.build().expect("valid config")
}

fn fake(index: usize) -> DeviceId {
    DeviceId {
        kind: DeviceKind::Other("fake"),
        index,
    }
}

/// How a fake device behaves.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Runs the evaluation in the reference interpreter.
    Works,
    /// Reports out of memory, as the CUDA device does when its memory is full.
    OutOfMemory,
    /// Fails with an error that is not about memory.
    Broken,
}

/// A device that is not the CPU: a stand-in GPU that works, runs out of memory, or
/// breaks, and counts its calls.
#[derive(Debug)]
struct Fake {
    index: usize,
    gpu: bool,
    behaviour: Behaviour,
    calls: AtomicUsize,
}

impl Fake {
    fn gpu(index: usize, behaviour: Behaviour) -> Arc<Fake> {
        Arc::new(Fake {
            index,
            gpu: true,
            behaviour,
            calls: AtomicUsize::new(0),
        })
    }
}

impl Device for Fake {
    fn id(&self) -> DeviceId {
        fake(self.index)
    }
    fn is_gpu(&self) -> bool {
        self.gpu
    }
    fn describe(&self) -> String {
        format!("fake {:?}", self.behaviour)
    }
    fn execute(
        &self,
        g: &Graph,
        inputs: &Inputs,
        _cfg: &Config,
    ) -> Result<Evaluation, RuntimeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Behaviour::Works => {
                let mut ev = ndfuse_runtime::execute(g, inputs, BackendKind::Interp)?;
                ev.device = self.id();
                Ok(ev)
            }
            Behaviour::OutOfMemory => Err(AllocError::OutOfMemory {
                memory: self.id().to_string(),
                bytes: 1 << 40,
            }
            .into()),
            Behaviour::Broken => Err(RuntimeError::Cuda(format!("{}: launch failed", self.id()))),
        }
    }
    fn transfer(&self, a: &HostArray) -> Result<HostArray, RuntimeError> {
        match self.behaviour {
            Behaviour::Works => Ok(a.clone()),
            _ => Err(AllocError::OutOfMemory {
                memory: self.id().to_string(),
                bytes: a.len(),
            }
            .into()),
        }
    }
}

/// Two CPU devices of one worker thread each.
fn two_cpus() -> Vec<Arc<dyn Device>> {
    CpuDevice::split(2, 2)
        .expect("2 threads make 2 devices")
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect()
}

fn set_of(devices: Vec<Arc<dyn Device>>, cfg: &Config) -> Arc<DeviceSet> {
    Arc::new(DeviceSet::new(devices, cfg).expect("valid set"))
}

fn ids(set: &DeviceSet) -> Vec<String> {
    set.devices().iter().map(|d| d.id().to_string()).collect()
}

/// Four different programs and what each must give (from the global context, whole host).
fn programs(ctx: &Context) -> Vec<Tensor> {
    let x = ctx
        .from_vec((0..64).map(|i| i as f32 * 0.25 - 4.0).collect(), &[8, 8])
        .expect("64");
    vec![
        (&x * 2.0 + 1.0).exp().sum(1),
        x.softmax(-1),
        x.abs().sqrt() - &x,
        x.max(0),
    ]
}

fn reference() -> Vec<Vec<f32>> {
    let ctx = Context::builder()
        .backend(BackendKind::Cpu)
        .build()
        .expect("ok");
    programs(&ctx)
        .iter()
        .map(|t| {
            ctx.eval(&[t]).expect("runs")[0]
                .to_vec::<f32>()
                .expect("f32")
        })
        .collect()
}

#[test]
fn two_cpu_devices_of_one_thread_each_share_a_batch() {
    let cpus = CpuDevice::split(2, 2).expect("2 devices");
    for (i, d) in cpus.iter().enumerate() {
        assert_eq!(d.threads(), 1);
        let (threads, name) = d.run(|| {
            (
                rayon::current_num_threads(),
                std::thread::current().name().map(str::to_string),
            )
        });
        assert_eq!(threads, 1, "cpu:{i} is a pool of one thread");
        assert_eq!(name.as_deref(), Some(format!("ndfuse-cpu{i}-0").as_str()));
    }
    let cfg = config(&[]);
    let set = set_of(two_cpus(), &cfg);
    assert_eq!(ids(&set), ["cpu:0", "cpu:1"]);
    let ctx = Context::builder().devices(set).build().expect("ok");
    let progs = programs(&ctx);
    let batch: Vec<[&Tensor; 1]> = progs.iter().map(|t| [t]).collect();
    let groups: Vec<&[&Tensor]> = batch.iter().map(|b| &b[..]).collect();
    let out = ctx.eval_batch_report(&groups).expect("runs");
    let placed: Vec<String> = out.iter().map(|(_, r)| r.device().to_string()).collect();
    assert_eq!(placed, ["cpu:0", "cpu:1", "cpu:0", "cpu:1"]);
    // Same bits as the whole host: kernels split work by shape, not by thread count.
    let got: Vec<Vec<f32>> = out
        .iter()
        .map(|(a, _)| a[0].to_vec::<f32>().expect("f32"))
        .collect();
    assert_eq!(got, reference());
    assert!(out.iter().all(|(_, r)| r.moves().is_empty()));
    assert!(
        out.iter().all(|(_, r)| r.kernel_count() >= 1),
        "JIT kernels ran"
    );
}

#[test]
fn placement_exhausts_the_gpus_then_adds_cpus() {
    let cfg = config(&[]);
    let (g0, g1) = (
        Fake::gpu(0, Behaviour::Works),
        Fake::gpu(1, Behaviour::Works),
    );
    let mut devices = two_cpus();
    devices.push(g0.clone());
    devices.push(g1.clone());
    let set = set_of(devices, &cfg);
    // GPUs above CPUs by priority; ties keep the order given.
    assert_eq!(ids(&set), ["fake:0", "fake:1", "cpu:0", "cpu:1"]);
    let show = |n| -> Vec<String> { set.placement(n).iter().map(ToString::to_string).collect() };
    assert_eq!(show(1), ["fake:0"]);
    assert_eq!(show(2), ["fake:0", "fake:1"]);
    assert_eq!(show(3), ["fake:0", "fake:1", "cpu:0"]);
    assert_eq!(
        show(6),
        ["fake:0", "fake:1", "cpu:0", "cpu:1", "fake:0", "fake:1"]
    );

    let ctx = Context::builder()
        .devices(Arc::clone(&set))
        .build()
        .expect("ok");
    let progs = programs(&ctx);
    let out = ctx
        .eval_batch_report(&[&[&progs[0]], &[&progs[1]], &[&progs[2]]])
        .expect("runs");
    let placed: Vec<String> = out.iter().map(|(_, r)| r.device().to_string()).collect();
    assert_eq!(placed, ["fake:0", "fake:1", "cpu:0"]);
    assert_eq!(
        (
            g0.calls.load(Ordering::SeqCst),
            g1.calls.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    let want = reference();
    for (i, (a, _)) in out.iter().enumerate() {
        let got = a[0].to_vec::<f32>().expect("f32");
        let close = got
            .iter()
            .zip(&want[i])
            .all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0));
        assert!(close, "program {i}: {got:?} vs {:?}", want[i]);
    }

    // The priorities decide: CPUs above GPUs puts the CPUs first.
    let cpu_first = config(&[("backend_priority_cpu", "200")]);
    let mut devices = two_cpus();
    devices.insert(0, Fake::gpu(0, Behaviour::Works));
    assert_eq!(
        ids(&set_of(devices, &cpu_first)),
        ["cpu:0", "cpu:1", "fake:0"]
    );
}

#[test]
fn a_device_out_of_memory_moves_the_evaluation_to_the_next_by_priority() {
    let cfg = config(&[]);
    let full = Fake::gpu(0, Behaviour::OutOfMemory);
    let mut devices = two_cpus();
    devices.push(full.clone());
    let set = set_of(devices, &cfg);
    assert_eq!(ids(&set), ["fake:0", "cpu:0", "cpu:1"]);
    let ctx = Context::builder().devices(set).build().expect("ok");
    let progs = programs(&ctx);
    let want = reference();

    // One eval on an unbound thread starts at the highest priority: the full fake.
    let (a, r) = ctx.eval_report(&[&progs[0]]).expect("moved, then ran");
    assert_eq!(r.device(), &DeviceId::cpu(0), "the next device by priority");
    assert_eq!(r.moves().len(), 1);
    let DeviceMove { from, to, reason } = &r.moves()[0];
    assert_eq!((from, to), (&fake(0), &DeviceId::cpu(0)));
    assert!(reason.contains("out of memory"), "{reason}");
    assert_eq!(a[0].to_vec::<f32>().expect("f32"), want[0]);

    // A batch: the job placed on the full device moves; the others stay.
    let out = ctx
        .eval_batch_report(&[&[&progs[1]], &[&progs[2]], &[&progs[3]]])
        .expect("runs");
    let placed: Vec<String> = out.iter().map(|(_, r)| r.device().to_string()).collect();
    assert_eq!(placed, ["cpu:0", "cpu:0", "cpu:1"]);
    let moved: Vec<usize> = out.iter().map(|(_, r)| r.moves().len()).collect();
    assert_eq!(moved, [1, 0, 0]);
    for (i, (a, _)) in out.iter().enumerate() {
        assert_eq!(
            a[0].to_vec::<f32>().expect("f32"),
            want[i + 1],
            "program {}",
            i + 1
        );
    }
    assert_eq!(
        full.calls.load(Ordering::SeqCst),
        2,
        "tried once per placed eval"
    );
}

/// Set in the child of the logging test.
const CHILD: &str = "DEVICES_TEST_CHILD";

/// The child's part of the logging test: one eval that leaves a full device.
#[test]
fn child_moves_one_eval() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let cfg = config(&[]);
    let mut devices = two_cpus();
    devices.push(Fake::gpu(0, Behaviour::OutOfMemory));
    let ctx = Context::builder()
        .devices(set_of(devices, &cfg))
        .build()
        .expect("ok");
    let x = ctx.ones(&[16]);
    let (_, r) = ctx.eval_report(&[&x.exp()]).expect("runs");
    println!("<<<{}>>>", r.device());
}

#[test]
fn the_move_is_logged_on_stderr() {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_moves_one_eval",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run child");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("<<<cpu:0>>>"), "{stdout}\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ndfuse: fake:0 ran out of memory"))
        .unwrap_or_else(|| panic!("no move logged:\n{stderr}"));
    assert!(
        line.contains("evaluation moved to cpu:0") && line.contains("out of memory"),
        "{line}"
    );
}

#[test]
fn out_of_memory_everywhere_is_one_error_naming_every_device() {
    let cfg = config(&[]);
    let set = set_of(
        vec![
            Fake::gpu(0, Behaviour::OutOfMemory),
            Fake::gpu(1, Behaviour::OutOfMemory),
        ],
        &cfg,
    );
    let ctx = Context::builder().devices(set).build().expect("ok");
    let err = ctx
        .eval(&[&ctx.ones(&[4]).exp()])
        .expect_err("nowhere to go");
    let text = err.to_string();
    assert!(
        text.starts_with("out of memory on every device: fake:0: ") && text.contains("; fake:1: "),
        "{text}"
    );
}

#[test]
fn an_error_that_is_not_about_memory_does_not_move() {
    let cfg = config(&[]);
    let broken = Fake::gpu(0, Behaviour::Broken);
    let mut devices = two_cpus();
    devices.push(broken.clone());
    let ctx = Context::builder()
        .devices(set_of(devices, &cfg))
        .build()
        .expect("ok");
    let err = ctx
        .eval(&[&ctx.ones(&[4]).exp()])
        .expect_err("broken device");
    assert_eq!(err.to_string(), "CUDA driver: fake:0: launch failed");
    assert_eq!(broken.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_bound_thread_evaluates_on_its_device() {
    let cfg = config(&[]);
    let set = set_of(two_cpus(), &cfg);
    let ctx = Context::builder().devices(set).build().expect("ok");
    // On a thread of its own: bindings are per thread and must not leak into others.
    std::thread::scope(|s| {
        s.spawn(|| {
            let y = ctx.ones(&[4]).exp();
            ctx.bind_thread(&DeviceId::cpu(1))
                .expect("cpu:1 is in the set");
            assert_eq!(ndfuse::bound_device(), Some(DeviceId::cpu(1)));
            let (_, r) = ctx.eval_report(&[&y]).expect("runs");
            assert_eq!(r.device(), &DeviceId::cpu(1));
            // A device the set lacks is refused and the binding stays.
            let err = ctx
                .bind_thread(&DeviceId::cuda(3))
                .expect_err("not in the set");
            assert!(
                err.to_string()
                    .contains("device cuda:3 is not in the device set (it has cpu:0, cpu:1)"),
                "{err}"
            );
            assert_eq!(ndfuse::bound_device(), Some(DeviceId::cpu(1)));
            // The unchecked binding is reported at eval.
            ndfuse::bind_thread(fake(9));
            let err = ctx.eval(&[&y]).expect_err("not in the set");
            assert!(err.to_string().contains("device fake:9 is not in"), "{err}");
            assert_eq!(ndfuse::unbind_thread(), Some(fake(9)));
            let (_, r) = ctx.eval_report(&[&y]).expect("runs");
            assert_eq!(r.device(), &DeviceId::cpu(0), "unbound: highest priority");
        })
        .join()
        .expect("thread ran");
    });
}

#[test]
fn a_bound_thread_on_the_process_set_runs_there() {
    std::thread::spawn(|| {
        let ctx = Context::new();
        let y = ctx.ones(&[4]).exp();
        let (_, r) = ctx.eval_report(&[&y]).expect("runs");
        assert_eq!(
            r.device(),
            &DeviceId::cpu(0),
            "outside a set: the whole host"
        );
        ctx.bind_thread(&DeviceId::cpu(0))
            .expect("the process set has cpu:0");
        let (a, r) = ctx.eval_report(&[&y]).expect("runs");
        assert_eq!(r.device(), &DeviceId::cpu(0));
        assert!((a[0].to_vec::<f32>().expect("f32")[0] - 1f32.exp()).abs() < 1e-6);
        assert!(ctx.bind_thread(&fake(0)).is_err());
        ndfuse::unbind_thread();
    })
    .join()
    .expect("thread ran");
}

#[test]
fn allow_multi_gpu_spreads_threads_round_robin_and_keeps_them() {
    let on = config(&[("allow_multi_gpu", "true")]);
    let mut devices = two_cpus();
    devices.push(Fake::gpu(0, Behaviour::Works));
    devices.push(Fake::gpu(1, Behaviour::Works));
    let set = set_of(devices, &on);
    let got: Vec<(Option<DeviceId>, Option<DeviceId>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (set.device_for_thread(&on), set.device_for_thread(&on))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ran"))
            .collect()
    });
    let mut count: HashMap<String, usize> = HashMap::new();
    for (first, again) in &got {
        assert_eq!(first, again, "a thread keeps its device");
        *count
            .entry(first.as_ref().expect("placed").to_string())
            .or_default() += 1;
    }
    assert_eq!(
        count,
        HashMap::from([("fake:0".to_string(), 2), ("fake:1".to_string(), 2)]),
        "only GPUs, in turn"
    );
    // Off: a thread has no device of its own (evaluations take the first by priority).
    let off = config(&[]);
    assert_eq!(set.device_for_thread(&off), None);

    // Without GPUs, the CPU devices take turns.
    let cpus = set_of(two_cpus(), &on);
    let got: Vec<String> = (0..2)
        .map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| cpus.device_for_thread(&on))
                    .join()
                    .expect("ran")
                    .expect("placed")
                    .to_string()
            })
        })
        .collect();
    assert_eq!(got, ["cpu:0", "cpu:1"]);
}

#[test]
fn to_device_copies_on_the_device_and_records_it() {
    let cfg = config(&[]);
    let mut devices = two_cpus();
    devices.push(Fake::gpu(0, Behaviour::OutOfMemory));
    let ctx = Context::builder()
        .devices(set_of(devices, &cfg))
        .build()
        .expect("ok");
    let a = ctx.arange(0.0, 8.0, 1.0).expect("ok").eval().expect("runs");
    let on = ctx.to_device(&a, &DeviceId::cpu(1)).expect("copied");
    assert_eq!(on.device(), &DeviceId::cpu(1));
    assert_eq!(on.array(), &a);
    assert_ne!(
        on.array().as_host().storage().as_ptr(),
        a.as_host().storage().as_ptr(),
        "a copy, not a view"
    );
    let err = ctx.to_device(&a, &fake(0)).expect_err("full");
    assert!(err.to_string().contains("out of memory"), "{err}");
    let err = ctx.to_device(&a, &DeviceId::cuda(0)).expect_err("absent");
    assert!(err.to_string().contains("not in the device set"), "{err}");
    // The copy feeds later evaluations like any array.
    let t = ctx.from_array(on.array());
    assert_eq!(
        (&t * 2.0)
            .eval()
            .expect("runs")
            .to_vec::<f32>()
            .expect("f32"),
        vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    );
}

#[test]
fn bad_sets_and_splits_are_errors() {
    let cfg = config(&[]);
    assert!(matches!(
        DeviceSet::new(Vec::new(), &cfg),
        Err(DeviceError::Empty)
    ));
    let twice: Vec<Arc<dyn Device>> = vec![
        Fake::gpu(0, Behaviour::Works),
        Fake::gpu(0, Behaviour::Works),
    ];
    match DeviceSet::new(twice, &cfg) {
        Err(DeviceError::Duplicate { device }) => assert_eq!(device, fake(0)),
        other => panic!("{other:?}"),
    }
    let err = CpuDevice::split(3, 2).expect_err("3 devices from 2 threads");
    assert_eq!(
        err.to_string(),
        "cannot make 3 CPU devices from 2 threads: every CPU device needs at least one thread"
    );
    assert!(CpuDevice::split(0, 2).is_err());
    assert!(CpuDevice::with_threads(0, 0).is_err());
    // Uneven splits give the first devices one more thread.
    let threads: Vec<usize> = CpuDevice::split(2, 5)
        .expect("ok")
        .iter()
        .map(CpuDevice::threads)
        .collect();
    assert_eq!(threads, [3, 2]);
}

#[test]
fn discover_finds_the_cpu_and_every_gpu_the_registry_finds() {
    let cfg = config(&[]);
    let reg = ndfuse_runtime::Registry::discover(&cfg);
    let gpus = match reg.get(BackendKind::Cuda).map(|e| &e.status) {
        Some(Ok(devices)) => devices.len(),
        _ => 0,
    };
    let set = DeviceSet::discover(&cfg, 1).expect("discovers");
    let mut want: Vec<String> = (0..gpus).map(|i| format!("cuda:{i}")).collect();
    want.push("cpu:0".into());
    assert_eq!(ids(&set), want);
    assert!(set.to_string().contains("cpu:0    host ("), "{set}");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores >= 2 {
        let split = DeviceSet::discover(&cfg, 2).expect("discovers");
        assert_eq!(ids(&split)[gpus..], ["cpu:0", "cpu:1"]);
    }
    assert!(DeviceSet::discover(&cfg, cores + 1).is_err());
}

/// With GPUs: each ordinal runs on its own device, and a batch uses every GPU before
/// the CPU. Skipped (with the reason) without one unless `NDFUSE_REQUIRE_CUDA=1`.
#[test]
fn every_cuda_ordinal_runs_on_its_own_device() {
    let cfg = config(&[]);
    let reg = ndfuse_runtime::Registry::discover(&cfg);
    let gpus = match reg.get(BackendKind::Cuda).map(|e| &e.status) {
        Some(Ok(devices)) => devices.len(),
        other => {
            if std::env::var("NDFUSE_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("NDFUSE_REQUIRE_CUDA=1 but the CUDA backend is unavailable: {other:?}");
            }
            eprintln!("every_cuda_ordinal_runs_on_its_own_device: skipped: no CUDA ({other:?})");
            return;
        }
    };
    let set = Arc::new(DeviceSet::discover(&cfg, 1).expect("discovers"));
    let ctx = Context::builder()
        .devices(Arc::clone(&set))
        .build()
        .expect("ok");
    let progs = programs(&ctx);
    let want = reference();
    for ordinal in 0..gpus {
        std::thread::scope(|s| {
            s.spawn(|| {
                ctx.bind_thread(&DeviceId::cuda(ordinal))
                    .expect("in the set");
                let (a, r) = ctx.eval_report(&[&progs[2]]).expect("runs");
                assert_eq!(r.device(), &DeviceId::cuda(ordinal));
                assert!(r.evaluation().paths.iter().all(|p| matches!(
                    p,
                    ndfuse_runtime::StepPath::Cuda { device, .. } if *device == ordinal
                ) || matches!(
                    p,
                    ndfuse_runtime::StepPath::Interp
                )));
                let got = a[0].to_vec::<f32>().expect("f32");
                let close = got
                    .iter()
                    .zip(&want[2])
                    .all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0));
                assert!(close, "cuda:{ordinal}: {got:?}");
            })
            .join()
            .expect("ran");
        });
    }
    let groups: Vec<[&Tensor; 1]> = (0..gpus + 1).map(|i| [&progs[i % progs.len()]]).collect();
    let groups: Vec<&[&Tensor]> = groups.iter().map(|g| &g[..]).collect();
    let out = ctx.eval_batch_report(&groups).expect("runs");
    let placed: Vec<String> = out.iter().map(|(_, r)| r.device().to_string()).collect();
    let mut expect: Vec<String> = (0..gpus).map(|i| format!("cuda:{i}")).collect();
    expect.push("cpu:0".into());
    assert_eq!(placed, expect, "every GPU, then the CPU");
}
