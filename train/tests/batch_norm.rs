//! Issue 36: the data-parallel wrapper refuses a model with buffers (batch norm's
//! running statistics), whose averaging across workers is not done yet, rather than
//! train replicas whose statistics the averaged model would never see.

use ndfuse::{BatchNorm, Context};
use ndfuse_nn::{BatchNorm2d, Flatten, Init, Layer, Linear, Loss, Optimizer, Sequential, Trainer};

#[test]
fn the_data_parallel_wrapper_refuses_running_statistics() {
    let ctx = Context::new();
    let m = Sequential::new()
        .push(BatchNorm2d::new(&ctx, "bn", 2, BatchNorm::new()).unwrap())
        .push(Flatten)
        .push(Linear::new(&ctx, "fc", 18, 3, Init::GlorotUniform, 1).unwrap());
    let opt = Optimizer::sgd(&m.parameters(), 0.1);
    let t = Trainer::new(m, opt, Loss::Mse).unwrap();
    let Err(e) = ndfuse_train::ParallelWrapper::builder(t).workers(2).build() else {
        panic!("a model with running statistics was accepted");
    };
    assert!(e.to_string().contains("running statistics"), "{e}");
}
