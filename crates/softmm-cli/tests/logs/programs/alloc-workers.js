// Allocate buffers in two worker threads and the main thread, then exit.
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
function churn(n) {
  const keep = [];
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const b = Buffer.alloc(256 * 1024 + (i % 7) * 4096, i & 0xff);
    sum += b[b.length - 1];
    if (i % 4 === 0) keep.push(b);
    if (keep.length > 16) keep.shift();
  }
  const arr = [];
  for (let i = 0; i < 20000; i++) arr.push({ i, s: 'x'.repeat(i % 50) });
  return sum + arr.length;
}
if (isMainThread) {
  let done = 0;
  for (let w = 0; w < 2; w++) {
    const worker = new Worker(__filename, { workerData: 40 + w * 10 });
    worker.on('message', (m) => { console.log('worker', w, m); if (++done === 2) console.log('main', churn(30)); });
  }
} else {
  parentPort.postMessage(churn(workerData));
}
