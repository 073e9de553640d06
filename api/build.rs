//! Generates the ttrpc/protobuf code of the node-local APIs
//! (pure-Rust parser: no protoc needed): proto/torpor/store/v1/store.proto
//! into `$OUT_DIR/store/`, proto/torpor/control/v1/control.proto into
//! `$OUT_DIR/control/`.
use std::path::PathBuf;

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (name, proto) in [("store", "proto/torpor/store/v1/store.proto"), ("control", "proto/torpor/control/v1/control.proto")] {
        let out = out_dir.join(name);
        std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
        ttrpc_codegen::Codegen::new()
            .inputs([proto])
            .include("proto")
            .rust_protobuf()
            .rust_protobuf_customize(ttrpc_codegen::ProtobufCustomize::default().gen_mod_rs(false))
            .customize(ttrpc_codegen::Customize { async_all: true, ..Default::default() })
            .out_dir(&out)
            .run()
            .unwrap_or_else(|e| panic!("generate the {name} API from {proto}: {e}"));
        // `include!` cannot take inner attributes: drop them from the generated files.
        for entry in std::fs::read_dir(&out).unwrap_or_else(|e| panic!("read {}: {e}", out.display())) {
            let path = entry.expect("dir entry").path();
            let text = std::fs::read_to_string(&path).expect("read generated file");
            let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("#!") && !l.starts_with("//!")).collect();
            std::fs::write(&path, kept.join("\n")).expect("rewrite generated file");
        }
        println!("cargo:rerun-if-changed={proto}");
    }
}
