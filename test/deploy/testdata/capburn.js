// A busy JavaScript function for TestCapabilitiesNode: capBurnLeaf is where the time goes.
function capBurnLeaf(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s = (s + i * 7) % 1000003;
  return s;
}
function capBurnOuter() {
  let t = 0;
  for (;;) {
    t += capBurnLeaf(100000);
    if (t < 0) break;
  }
}
capBurnOuter();
