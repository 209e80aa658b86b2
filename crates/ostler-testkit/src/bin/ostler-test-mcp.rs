//! A tiny stdio MCP server for tests; see [`ostler_testkit::mcp_server`].

fn main() {
    if let Err(e) = ostler_testkit::mcp_server::run() {
        eprintln!("ostler-test-mcp: {e}");
        std::process::exit(1);
    }
}
