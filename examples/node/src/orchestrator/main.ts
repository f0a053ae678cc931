/** node dist/orchestrator/main.js [--port N] [--host H] [--data-dir DIR] [--token T] */

import { parseArgs } from "../lib/service";
import { CartPoleOrchestratorService } from "./service";

const options = parseArgs(process.argv.slice(2), 8080);
// it calls its agents with its own token, as the Python orchestrators do
new CartPoleOrchestratorService(options.dataDir, options.token).listen(options);
