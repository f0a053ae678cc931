/** node dist/agent/main.js [--port N] [--host H] [--data-dir DIR] [--token T] */

import { parseArgs } from "../lib/service";
import { RandomAgentService } from "./service";

const options = parseArgs(process.argv.slice(2), 8081);
new RandomAgentService(options.dataDir).listen(options);
