//! Generates the ttrpc/protobuf code of proto/torpor/store/v1/store.proto
//! (pure-Rust parser: no protoc needed).
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("store");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/store");
    ttrpc_codegen::Codegen::new()
        .inputs(["proto/torpor/store/v1/store.proto"])
        .include("proto")
        .rust_protobuf()
        .rust_protobuf_customize(ttrpc_codegen::ProtobufCustomize::default().gen_mod_rs(false))
        .customize(ttrpc_codegen::Customize { async_all: true, ..Default::default() })
        .out_dir(&out)
        .run()
        .expect("generate the store API from proto/torpor/store/v1/store.proto");
    // `include!` cannot take inner attributes: drop them from the generated files.
    for entry in std::fs::read_dir(&out).expect("read OUT_DIR/store") {
        let path = entry.expect("dir entry").path();
        let text = std::fs::read_to_string(&path).expect("read generated file");
        let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("#!") && !l.starts_with("//!")).collect();
        std::fs::write(&path, kept.join("\n")).expect("rewrite generated file");
    }
    println!("cargo:rerun-if-changed=proto/torpor/store/v1/store.proto");
}
