fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
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
