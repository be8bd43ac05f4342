#![no_main]
//! See calico_cni_fuzz::cni_args.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = calico_cni_fuzz::cni_args(data);
});
