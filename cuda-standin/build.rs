//! Gives the cdylib the soname `libcuda.so`: once a process has loaded it by
//! path (RTLD_GLOBAL), cudarc's own `dlopen("libcuda.so")` finds it by soname.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so");
    println!("cargo:rerun-if-changed=build.rs");
}
