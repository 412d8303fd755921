fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not with env!(): cargo shares this build script's binary between
    // checkouts at different paths that use the same target directory (a CI clone and the
    // working tree), and a path compiled in would point into the other checkout.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    let files = [
        root.join("qq/v1/broker.proto"),
        root.join("qq/v1/internal.proto"),
    ];
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&files, &[root.clone()])?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
