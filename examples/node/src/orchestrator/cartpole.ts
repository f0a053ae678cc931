/** gymnasium's CartPole-v1, ported: the same dynamics (Euler integration, tau 0.02), the
 * same termination (|x| > 2.4, |theta| > 12 degrees), reward 1 per step, and the
 * TimeLimit's truncation at 500 steps. The starting state is uniform in [-0.05, 0.05]^4 as
 * gymnasium's, drawn from this port's own seeded generator (not numpy's stream). */

import type { components } from "../generated/orchestrator";
import { Rng } from "../lib/rng";

const GRAVITY = 9.8;
const MASS_CART = 1.0;
const MASS_POLE = 0.1;
const TOTAL_MASS = MASS_CART + MASS_POLE;
const LENGTH = 0.5; // half the pole's length
const POLE_MASS_LENGTH = MASS_POLE * LENGTH;
const FORCE = 10.0;
const TAU = 0.02;
const THETA_LIMIT = (12 * 2 * Math.PI) / 360;
const X_LIMIT = 2.4;
const FLOAT_MAX = 1.7976931348623157e308; // how the services write an unbounded Box bound

export const ENV_IDS = ["NodeCartPole-v1", "CartPole-v1"];
export const MAX_EPISODE_STEPS = 500;

export interface Timestep {
  obs: number[];
  reward: number;
  terminated: boolean;
  truncated: boolean;
}

export const observationSpace: components["schemas"]["Space"] = {
  type: "Box",
  shape: [4],
  dtype: "float32",
  low: [-X_LIMIT * 2, -FLOAT_MAX, -THETA_LIMIT * 2, -FLOAT_MAX].map(Math.fround),
  high: [X_LIMIT * 2, FLOAT_MAX, THETA_LIMIT * 2, FLOAT_MAX].map(Math.fround),
};
// (Math.fround(FLOAT_MAX) is Infinity, which JSON cannot carry: the unbounded ones stay)
for (const bounds of [observationSpace.low, observationSpace.high] as number[][]) {
  bounds[1] = Math.sign(bounds[1]) * FLOAT_MAX;
  bounds[3] = Math.sign(bounds[3]) * FLOAT_MAX;
}

export const actionSpace: components["schemas"]["Space"] = { type: "Discrete", n: 2, start: 0 };

export class CartPole {
  private state = [0, 0, 0, 0];
  private steps = 0;
  private rng: Rng;

  constructor(seed: number | null, readonly maxSteps = MAX_EPISODE_STEPS) {
    this.rng = new Rng(seed);
  }

  reset(): number[] {
    this.state = this.state.map(() => this.rng.uniform(-0.05, 0.05));
    this.steps = 0;
    return this.obs();
  }

  step(action: number): Timestep {
    if (action !== 0 && action !== 1) throw new Error(`CartPole takes action 0 or 1, not ${JSON.stringify(action)}`);
    let [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? FORCE : -FORCE;
    const cos = Math.cos(theta);
    const sin = Math.sin(theta);
    const temp = (force + POLE_MASS_LENGTH * thetaDot ** 2 * sin) / TOTAL_MASS;
    const thetaAcc = (GRAVITY * sin - cos * temp) / (LENGTH * (4.0 / 3.0 - (MASS_POLE * cos ** 2) / TOTAL_MASS));
    const xAcc = temp - (POLE_MASS_LENGTH * thetaAcc * cos) / TOTAL_MASS;
    x += TAU * xDot;
    xDot += TAU * xAcc;
    theta += TAU * thetaDot;
    thetaDot += TAU * thetaAcc;
    this.state = [x, xDot, theta, thetaDot];
    this.steps += 1;
    const terminated = x < -X_LIMIT || x > X_LIMIT || theta < -THETA_LIMIT || theta > THETA_LIMIT;
    return { obs: this.obs(), reward: 1.0, terminated, truncated: !terminated && this.steps >= this.maxSteps };
  }

  private obs(): number[] {
    return this.state.map(Math.fround); // float32, as gymnasium's
  }
}
