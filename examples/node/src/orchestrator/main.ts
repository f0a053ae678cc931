/** node dist/orchestrator/main.js [--port N] [--host H] [--data-dir DIR] [--token T] */

import { parseArgs } from "../lib/service";
import { CartPoleOrchestratorService } from "./service";

const options = parseArgs(process.argv.slice(2), 8080);
new CartPoleOrchestratorService(options.dataDir).listen(options);
