fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not with env!(): cargo shares this build script's binary between
    // checkouts at different paths that use the same target directory (a CI clone and the
    // working tree), and a path compiled in would point into the other checkout.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    // Two runs, so the descriptor set served by gRPC reflection on the client port holds only
    // the client contract: the internal service is not reachable there, and reflection must
    // not describe it.
    // Both services decode with crate::codec (INVALID_ARGUMENT for bytes that do not decode).
    tonic_prost_build::configure()
        .bytes(".")
        .codec_path("crate::codec::ProtoCodec")
        .file_descriptor_set_path(out_dir.join("qq_v1_descriptor.bin"))
        .compile_protos(
            &[root.join("qq/v1/broker.proto")],
            std::slice::from_ref(&root),
        )?;
    tonic_prost_build::configure()
        .bytes(".")
        .codec_path("crate::codec::ProtoCodec")
        .compile_protos(
            &[root.join("qq/v1/internal.proto")],
            std::slice::from_ref(&root),
        )?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
