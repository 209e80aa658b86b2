//! A fast fake of the `claude` CLI (2.1.330 shapes) for tests and benchmarks; see
//! [`ostler_testkit::fake_claude`] for what it does and its modes.

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    std::process::exit(ostler_testkit::fake_claude::run(&args));
}
