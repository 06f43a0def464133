// The Node.js workload of the V8 stack tests: node nodeworkload.js MODE SECONDS.
// Each function starts with "function NAME(" at column 0 and ends with "}" at column 0:
// the test reads the functions' line spans so. Names are ones no other code has.
'use strict';
let sink = 0;

function quokkaLeaf(n) {
  let c = sink;
  for (let i = 0; i < n; i++) c = (Math.imul(c, 31) + (i ^ (c >>> 7))) | 0;
  return c;
}

function quokkaMiddle(n) {
  const c = quokkaLeaf(n);
  sink = c;
  return c;
}

function quokkaOuter(n) {
  const c = quokkaMiddle(n);
  sink = c ^ 5;
  return c;
}

function quokkaMain(secs) {
  const end = Date.now() + secs * 1000;
  while (Date.now() < end) quokkaOuter(200000);
}

// decoyWarmup runs at start only: a sample named after it names something else.
function decoyWarmup(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += i % 7;
  return s;
}

async function tapirLeaf(n) {
  await null;
  let c = sink;
  for (let i = 0; i < n; i++) c = (Math.imul(c, 17) + i) | 0;
  return c;
}

async function tapirOuter(n) {
  const c = await tapirLeaf(n);
  sink = c;
  return c;
}

async function tapirMain(secs) {
  const end = Date.now() + secs * 1000;
  while (Date.now() < end) await tapirOuter(200000);
}

// The gc mode compiles and drops functions and allocates, so that the collector runs
// and moves objects while the chain runs.
function okapiLeaf(n) {
  let keep = [];
  let c = sink;
  for (let i = 0; i < n; i++) {
    c = (Math.imul(c, 13) + i) | 0;
    if ((i & 255) === 0) keep.push({ c, s: 'x' + i });
  }
  sink = c + keep.length;
  return c;
}

function okapiMiddle(n) {
  const f = new Function('a', 'return a + ' + (sink & 1023) + ';');
  return okapiLeaf(n) + f(1);
}

function okapiMain(secs) {
  const end = Date.now() + secs * 1000;
  while (Date.now() < end) okapiMiddle(100000);
}

const mode = process.argv[2] || 'chain';
const secs = Number(process.argv[3] || 30);
for (let i = 0; i < 2000; i++) decoyWarmup(1000);
switch (mode) {
  case 'chain':
    quokkaMain(secs);
    break;
  case 'async':
    tapirMain(secs);
    break;
  case 'gc':
    okapiMain(secs);
    break;
  default:
    throw new Error('unknown mode ' + mode);
}
