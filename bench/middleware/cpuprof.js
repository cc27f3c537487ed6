// Summarises a Node --cpu-prof profile (bench/middleware.sh --profile):
// self time per package (node_modules/<name>, Node's internals, the app,
// idle, GC) and the functions with the most self time, as % of the run.
//
//   node cpuprof.js FILE.cpuprofile [TOP]
'use strict';
const fs = require('node:fs');
const [file, topArg] = process.argv.slice(2);
const top = Number(topArg || 25);
const prof = JSON.parse(fs.readFileSync(file, 'utf8'));
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const self = new Map();
let total = 0;
for (let i = 0; i < prof.samples.length; i++) {
  const dt = prof.timeDeltas[i] || 0;
  self.set(prof.samples[i], (self.get(prof.samples[i]) || 0) + dt);
  total += dt;
}
function packageOf(url, name) {
  if (!url) return name.startsWith('(') ? name : '(native)';
  const m = url.match(/node_modules\/((?:@[^/]+\/)?[^/]+)/);
  if (m) return m[1];
  if (url.startsWith('node:')) return 'node internals';
  return 'app: ' + url.split('/').pop();
}
const funcs = new Map();
const pkgs = new Map();
for (const [id, t] of self) {
  const f = byId.get(id).callFrame;
  const name = f.functionName || '(anonymous)';
  const key = `${name}  ${f.url ? f.url.replace(/^.*node_modules\//, '').replace(/^file:\/\//, '') + ':' + (f.lineNumber + 1) : ''}`;
  funcs.set(key, (funcs.get(key) || 0) + t);
  const p = packageOf(f.url, name);
  pkgs.set(p, (pkgs.get(p) || 0) + t);
}
const pct = (t) => (100 * t / total).toFixed(1).padStart(5) + ' %';
console.log(`${file}: ${(total / 1e6).toFixed(2)} s sampled`);
console.log('self time per package:');
for (const [p, t] of [...pkgs].sort((a, b) => b[1] - a[1])) console.log(`  ${pct(t)}  ${p}`);
console.log(`top ${top} functions by self time:`);
for (const [k, t] of [...funcs].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`  ${pct(t)}  ${k}`);
