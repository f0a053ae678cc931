/** A small seeded generator (mulberry32), so that a seeded agent or env is reproducible;
 * unseeded, it starts from the clock and the process id. */

export class Rng {
  private s: number;

  constructor(seed?: number | null) {
    this.s = (seed ?? Date.now() ^ (process.pid << 16)) >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.s = (this.s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  uniform(low: number, high: number): number {
    return low + (high - low) * this.next();
  }

  /** An integer in [0, n). */
  below(n: number): number {
    return Math.floor(this.next() * n);
  }

  normal(): number {
    const u = 1 - this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.next());
  }

  exponential(): number {
    return -Math.log(1 - this.next());
  }
}
