#!/usr/bin/env node
// replbox from npm: this package holds no binary. npm installs the one optional dependency
// whose `os`, `cpu` and `libc` fit this machine (replbox-mcp-linux-x64, ...), which holds
// `replbox` and its helper `replbox-exec` side by side; this script starts that `replbox`
// with the same arguments and standard streams, passes signals on, and exits as it does.
"use strict";
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");

const PACKAGES = {
  "linux x64": "replbox-mcp-linux-x64",
  "linux arm64": "replbox-mcp-linux-arm64",
};

function fail(message) {
  process.stderr.write(`replbox-mcp: ${message}\n`);
  process.exit(1);
}

function binary() {
  const key = `${process.platform} ${process.arch}`;
  const pkg = PACKAGES[key];
  if (!pkg) {
    fail(
      `replbox runs on Linux (x64, arm64) only, and this is ${key}. ` +
        "Run it on a Linux machine, VM or container, and reach it over SSH or HTTP.",
    );
  }
  let dir;
  try {
    dir = path.dirname(require.resolve(`${pkg}/package.json`));
  } catch {
    fail(
      `${pkg}, the package holding replbox for ${key}, is not installed. npm leaves ` +
        "optional dependencies out with --omit=optional (or --no-optional): install without it.",
    );
  }
  const exe = path.join(dir, "bin", "replbox");
  // A tarball unpacked without modes loses the executable bits: put them back.
  for (const name of ["replbox", "replbox-exec"]) {
    const file = path.join(dir, "bin", name);
    try {
      fs.accessSync(file, fs.constants.X_OK);
    } catch {
      try {
        fs.chmodSync(file, 0o755);
      } catch {
        fail(`${file} is missing or cannot be made executable`);
      }
    }
  }
  return exe;
}

const child = spawn(binary(), process.argv.slice(2), { stdio: "inherit" });
const forward = (signal) => child.kill(signal);
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, forward);
}
child.on("error", (e) => fail(`cannot start replbox: ${e.message}`));
child.on("exit", (code, signal) => {
  if (signal) {
    for (const s of ["SIGINT", "SIGTERM", "SIGHUP"]) process.removeListener(s, forward);
    process.kill(process.pid, signal);
  } else {
    process.exit(code ?? 1);
  }
});
