//! The reference-model test: random operation sequences applied to a real
//! mount and to a plain directory holding an extracted copy of the same
//! packet must give the same results (values and errnos) and the same tree
//! (names, types, bytes, modes, link targets, link counts) after every
//! step, and again after a remount.

mod common;

use common::ops::{apply, op, tree};
use common::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mount_behaves_like_a_plain_directory(ops in prop::collection::vec(op(), 1..40)) {
        if !fuse_available() {
            return Ok(());
        }
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        model_tree(&ws);
        let packet = packet_of(&ws, tmp.path(), "p", &[]);
        let model = tmp.path().join("model");
        run(["unpack", packet.to_str().unwrap(), "--into", model.to_str().unwrap(), "--part", "workspace"]).ok();
        let m = Mounted::new(&packet, &tmp.path().join("mnt"), &tmp.path().join("upper"), &["--part", "workspace"]);
        prop_assert_eq!(tree(&m.mnt), tree(&model));
        for (k, op) in ops.iter().enumerate() {
            let got = apply(&m.mnt, op);
            let want = apply(&model, op);
            prop_assert_eq!(&got, &want, "step {} {:?}", k, op);
            prop_assert_eq!(tree(&m.mnt), tree(&model), "tree after step {} {:?}", k, op);
        }
        let mnt = m.mnt.clone();
        m.umount();
        let m2 = Mounted::new(&packet, &mnt, &tmp.path().join("upper"), &["--part", "workspace"]);
        prop_assert_eq!(tree(&m2.mnt), tree(&model), "after remount");
        m2.umount();
    }
}
