//! Exports the simulator's `getrandom` (src/entropy.rs) from its binaries' dynamic symbol
//! table, so that `dlsym(RTLD_DEFAULT, "getrandom")`, the `getrandom` crate's way of finding
//! the C library's, finds it first.

fn main() {
    println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol=getrandom");
}
