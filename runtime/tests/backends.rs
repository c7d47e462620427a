//! The backend registry: CPU and interpreter found, CUDA rejected with its reason, and
//! `choose` for auto, an explicit backend, the config's `backend` key and an absent one.

use ndfuse_runtime::{Backend, BackendKind, Config, DeviceInfo, Registry, RuntimeError};

/// A configuration from the builder only: the parent's environment and working
/// directory must not change what these tests see.
fn config(set: &[(&str, &str)]) -> Config {
    let mut b = Config::builder()
        .config_file(None)
        .environment(Vec::<(String, String)>::new());
    for (k, v) in set {
        b = b.set(k, *v);
    }
    b.build().expect("valid config")
}

#[test]
fn cpu_and_interp_found_cuda_rejected_with_reason() {
    let cfg = config(&[]);
    let reg = Registry::discover(&cfg);
    let names: Vec<&str> = reg.entries().iter().map(|e| e.name).collect();
    assert_eq!(names, ["cuda", "cpu", "interp"]);
    let cpu = reg.get(BackendKind::Cpu).expect("cpu compiled in");
    let devices = cpu.status.as_ref().expect("cpu always available");
    assert!(devices[0].threads >= 1);
    assert!(reg
        .get(BackendKind::Interp)
        .is_some_and(|e| e.is_available()));
    let cuda = reg
        .get(BackendKind::Cuda)
        .expect("cuda listed even when absent");
    let reason = cuda.status.as_ref().expect_err("no CUDA backend yet");
    assert!(
        reason.contains("libcuda.so not found")
            || reason.contains("not built yet")
            || reason.contains("not compiled with CUDA"),
        "{reason}"
    );
    // The table shows the reason too.
    let table = reg.to_string();
    assert!(table.contains("cuda    not available"), "{table}");
    assert!(table.contains(reason.as_str()), "{table}");
    assert!(
        table.contains("cpu     available      priority 0"),
        "{table}"
    );
}

#[test]
fn cpu_threads_shows_in_the_device() {
    let reg = Registry::discover(&config(&[("cpu_threads", "3")]));
    let cpu = reg.get(BackendKind::Cpu).expect("cpu");
    assert_eq!(cpu.status.as_ref().expect("available")[0].threads, 3);
}

#[test]
fn auto_picks_cpu_today() {
    let cfg = config(&[]);
    assert_eq!(
        ndfuse_runtime::choose(&cfg, None).expect("cpu"),
        BackendKind::Cpu
    );
    assert_eq!(
        ndfuse_runtime::choose(&cfg, Some(BackendKind::Auto)).expect("cpu"),
        BackendKind::Cpu
    );
    // The interpreter stays below the CPU whatever the CPU's priority.
    let cfg = config(&[("backend_priority_cpu", "-50")]);
    assert_eq!(
        ndfuse_runtime::choose(&cfg, None).expect("cpu"),
        BackendKind::Cpu
    );
}

#[test]
fn explicit_beats_config_beats_auto() {
    let cfg = config(&[("backend", "interp")]);
    assert_eq!(
        ndfuse_runtime::choose(&cfg, None).expect("ok"),
        BackendKind::Interp
    );
    // Auto in code defers to the config.
    assert_eq!(
        ndfuse_runtime::choose(&cfg, Some(BackendKind::Auto)).expect("ok"),
        BackendKind::Interp
    );
    assert_eq!(
        ndfuse_runtime::choose(&cfg, Some(BackendKind::Cpu)).expect("ok"),
        BackendKind::Cpu
    );
}

#[test]
fn asking_for_an_absent_backend_says_why() {
    let cfg = config(&[]);
    let reg = Registry::discover(&cfg);
    let reason = reg
        .get(BackendKind::Cuda)
        .and_then(|e| e.status.as_ref().err().cloned())
        .expect("cuda rejected");
    for (cfg, explicit) in [
        (config(&[]), Some(BackendKind::Cuda)),
        (config(&[("backend", "cuda")]), None),
    ] {
        let e = reg.choose(&cfg, explicit).unwrap_err();
        assert!(
            matches!(&e, RuntimeError::Unavailable { backend: "cuda", reason: r } if *r == reason),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!("backend cuda is not available: {reason}")
        );
    }
}

/// A GPU that is present, to show priorities deciding between two available backends.
#[derive(Debug)]
struct FakeGpu;

impl Backend for FakeGpu {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn priority(&self, cfg: &Config) -> i64 {
        cfg.backend_priority_gpu()
    }
    fn probe(&self, _cfg: &Config) -> Result<Vec<DeviceInfo>, String> {
        Ok(vec![DeviceInfo {
            name: "fake GPU".into(),
            threads: 108,
            memory: Some(80 << 30),
        }])
    }
}

/// A backend that is never there.
#[derive(Debug)]
struct Absent;

impl Backend for Absent {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn priority(&self, cfg: &Config) -> i64 {
        cfg.backend_priority_cpu()
    }
    fn probe(&self, _cfg: &Config) -> Result<Vec<DeviceInfo>, String> {
        Err("0 devices".into())
    }
}

#[test]
fn highest_priority_wins_gpu_above_cpu_by_default() {
    let with_gpu = |cfg: &Config| {
        Registry::from_backends(
            cfg,
            vec![Box::new(FakeGpu), Box::new(ndfuse_runtime::CpuBackend)],
        )
    };
    let cfg = config(&[]);
    assert_eq!(
        with_gpu(&cfg).choose(&cfg, None).expect("ok"),
        BackendKind::Cuda
    );
    let cfg = config(&[("backend_priority_cpu", "200")]);
    assert_eq!(
        with_gpu(&cfg).choose(&cfg, None).expect("ok"),
        BackendKind::Cpu
    );
    // A tie goes to the GPU, registered first.
    let cfg = config(&[("backend_priority_cpu", "100")]);
    assert_eq!(
        with_gpu(&cfg).choose(&cfg, None).expect("ok"),
        BackendKind::Cuda
    );
}

#[test]
fn nothing_available_lists_every_reason() {
    let cfg = config(&[]);
    let reg = Registry::from_backends(&cfg, vec![Box::new(Absent)]);
    let e = reg.choose(&cfg, None).unwrap_err();
    assert_eq!(e.to_string(), "no backend can run here: cpu: 0 devices");
    // A backend not compiled in at all.
    let e = reg.choose(&cfg, Some(BackendKind::Interp)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "backend interp is not available: not compiled into this build"
    );
}

/// Set in the child of [`execute_follows_the_environment`].
const CHILD: &str = "BACKENDS_TEST_CHILD";

/// Child entry: one `execute(Auto)` of a constant, printing the backend or the error.
#[test]
fn child_execute() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    use ndfuse_ir::{DType, Graph, Scalar, Shape};
    let mut g = Graph::new();
    let c = g.add_const(Scalar::F(1.5), DType::F32, Shape::new([2]));
    g.add_output(c);
    match ndfuse_runtime::execute(&g, &Default::default(), BackendKind::Auto) {
        Ok(ev) => println!("<<<{}>>>", ev.backend.name()),
        Err(e) => println!("<<<ERROR: {e}>>>"),
    }
}

/// Runs [`child_execute`] with `vars` as the only ndfuse variables.
fn run_child(vars: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", "child_execute", "--nocapture"])
        .current_dir(std::env::temp_dir())
        .env(CHILD, "1");
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("NDFUSE_") || k.starts_with("BACKEND_PRIORITY_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    match (stdout.find("<<<"), stdout.find(">>>")) {
        (Some(s), Some(e)) if s < e => stdout[s + 3..e].to_string(),
        _ => panic!("child printed no result:\n{stdout}"),
    }
}

#[test]
fn execute_follows_the_environment() {
    assert_eq!(run_child(&[]), "cpu");
    // Auto in code defers to the config's backend key.
    assert_eq!(run_child(&[("NDFUSE_BACKEND", "interp")]), "interp");
    assert!(run_child(&[("NDFUSE_BACKEND", "cuda")])
        .starts_with("ERROR: backend cuda is not available: "));
    // Pass options come from Config too: a bad debug level names its variable.
    assert_eq!(
        run_child(&[("NDFUSE_DEBUG", "9")]),
        "ERROR: bad value \"9\" for 'debug' in env NDFUSE_DEBUG: expected a level from 0 to 4"
    );
}
