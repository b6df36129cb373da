//! Generates the protocol's messages and service from `proto/` with a vendored `protoc`, so a
//! build needs nothing installed beyond cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/switchyard/federation/v1/federation.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &[proto], &["proto"])?;
    Ok(())
}
