//! The whole strict reader (open, then verify every member) on arbitrary
//! files: errors, never panics, hangs or unbounded allocation.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use sessionfs::api::Limits;
use sessionfs::api::Packet;
use sessionfs::api::verify;

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::tempfile().expect("temp file");
    f.write_all(data).expect("write");
    let limits = Limits { max_entries: 1000, max_bytes: 1 << 24, max_path_bytes: 4096 };
    if let Ok(p) = Packet::from_file(f, std::path::Path::new("fuzz"), &limits) {
        let _ = verify(&p, &|_| {});
    }
});
