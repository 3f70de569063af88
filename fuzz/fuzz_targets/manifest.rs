//! The manifest parser on arbitrary bytes: never panics, and whatever it
//! accepts is canonical (re-encodes to the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionfs::api::Limits;
use sessionfs::api::Manifest;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_entries: 1000, max_bytes: 1 << 30, max_path_bytes: 4096 };
    if let Ok(m) = Manifest::parse(data, &limits) {
        assert_eq!(m.encode(), data, "accepted a non-canonical manifest");
    }
});
