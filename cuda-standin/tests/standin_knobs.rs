//! Knobs a test sets before the process's first cuInit (as the executor tests do:
//! load the stand-in, set a knob, then let the executor initialise the driver)
//! stay set: cuInit reads the environment's knobs only if nothing read them yet.
//! Its own test binary, so that its cuInit is the process's first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use cudarc::driver::sys::{self, CUresult};
use tutti_cuda_standin::control::Standin;

#[test]
fn a_knob_set_before_the_first_cu_init_survives_it() {
    let s = Standin::load().expect("load the CUDA stand-in");
    s.reset();
    s.set_knob("sync_deadline_ms", 1234).unwrap();
    s.set_knob("landing_delay_ms", 77).unwrap();
    // SAFETY: the stand-in is loaded, so cudarc resolves libcuda to it.
    assert_eq!(unsafe { sys::cuInit(0) }, CUresult::CUDA_SUCCESS);
    assert_eq!(s.knob("sync_deadline_ms"), Some(1234));
    assert_eq!(s.knob("landing_delay_ms"), Some(77));
    assert!(s.set_knob("no_such_knob", 1).is_err(), "an unknown knob is refused");
}
