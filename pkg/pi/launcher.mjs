// ngharness's launcher for Pi (@mariozechner/pi-coding-agent), run by node
// inside the sandbox: `node ngharness-pi.mjs LAUNCH.json`. The pi adapter
// (pkg/pi) uploads it into the rollout's state folder and writes LAUNCH.json
// for each launch. It runs Pi's own agent through Pi's public SDK, set up as
// `pi -p --mode json --no-extensions --no-skills --no-prompt-templates
// --no-themes --no-context-files --provider P --model M --session-dir D`
// sets it up, and does one of two things:
//
//   - a fresh run: the task, read from a file byte for byte, is sent with
//     session.prompt(task, {expandPromptTemplates: false}) (the CLI takes
//     it only as an argument, which is unsafe, or trimmed from stdin);
//   - a continue of the saved session: the session file is opened, an error
//     result "No result provided" (Pi's own text for a call without a
//     result) is appended for each interrupted tool call the adapter names,
//     failed replies at the end are dropped from memory (as Pi's own retry
//     does), and the agent goes on with Agent.continue(): the model gets the
//     saved history and nothing the task did not have.
//
// Events go to stdout as JSON lines (the session header first, then the
// session's events but the streaming deltas), errors to stderr. Exit codes:
// 0 the run ended with the model's answer; 1 it ended in an error; 2 the
// launch could not be set up (the message says why); 129, 130, 143 on
// SIGHUP, SIGINT, SIGTERM, after killing the process groups of the tool
// calls still running (Pi's print mode does so on SIGTERM and SIGHUP only).
//
// LAUNCH.json: {"pi": the pi CLI, "agent_dir", "session_dir", "provider",
// "model", and either "task_file" (a fresh run) or "session_file" and
// "continue": {"at": the entry the file must end with, "answer": [{"id",
// "name"}] the calls to answer, "drop": how many failed replies end the
// chain, "ended": true when the run had ended and nothing is due}}.

import { existsSync, readFileSync, realpathSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGE = "@mariozechner/pi-coding-agent";
const NO_RESULT = "No result provided";

function fail(message) {
	process.stderr.write(`ngharness-pi: ${message}\n`);
	process.exit(2);
}

let launch;
try {
	launch = JSON.parse(readFileSync(process.argv[2], "utf8"));
} catch (err) {
	fail(`cannot read the launch file ${JSON.stringify(process.argv[2])}: ${err.message}`);
}

// packageRoot is the folder of Pi's package.json above the CLI, every link
// resolved (as node resolves the modules it loads, so the modules imported
// here are the ones Pi's own code imports).
function packageRoot(cli) {
	let dir;
	try {
		dir = dirname(realpathSync(cli));
	} catch (err) {
		fail(`cannot find Pi at ${JSON.stringify(cli)}: ${err.message}`);
	}
	for (;;) {
		const file = join(dir, "package.json");
		if (existsSync(file)) {
			try {
				const pkg = JSON.parse(readFileSync(file, "utf8"));
				if (pkg.name === PACKAGE) return { dir, pkg };
			} catch {
				// not this one
			}
		}
		const up = dirname(dir);
		if (up === dir) fail(`${JSON.stringify(cli)} is not in the package ${PACKAGE}`);
		dir = up;
	}
}

const { dir: root, pkg } = packageRoot(launch.pi);
const entry = pkg.exports?.["."]?.import ?? pkg.main;
const sdk = await import(pathToFileURL(join(root, entry)).href);
// Pi's print mode kills the process groups of the running tool calls on
// SIGTERM; the function is internal, in the module the bash tool tracks
// them in.
const shell = await import(pathToFileURL(join(root, "dist", "utils", "shell.js")).href);
const undici = await import(pathToFileURL(createRequire(join(root, "package.json")).resolve("undici")).href);
for (const [name, v] of [
	["SessionManager", sdk.SessionManager],
	["AuthStorage", sdk.AuthStorage],
	["createAgentSessionServices", sdk.createAgentSessionServices],
	["createAgentSessionFromServices", sdk.createAgentSessionFromServices],
	["createAgentSessionRuntime", sdk.createAgentSessionRuntime],
	["killTrackedDetachedChildren", shell.killTrackedDetachedChildren],
	["setGlobalDispatcher", undici.setGlobalDispatcher],
]) {
	if (typeof v !== "function") fail(`Pi ${pkg.version} at ${root} has no ${name}: this launcher was written for 0.73.1`);
}

// What Pi's cli.js does before main: its name, its marker, no warnings, and
// no undici body or header timeouts (the provider SDK keeps its own).
process.title = "pi";
process.env.PI_CODING_AGENT = "true";
process.emitWarning = () => {};
undici.setGlobalDispatcher(new undici.EnvHttpProxyAgent({ bodyTimeout: 0, headersTimeout: 0 }));
if (process.env.PI_OFFLINE === "1") process.env.PI_SKIP_VERSION_CHECK = "1";

function message(entry) {
	return entry?.type === "message" ? entry.message : undefined;
}

function failed(m) {
	return m?.role === "assistant" && (m.stopReason === "error" || m.stopReason === "aborted");
}

let sessionManager;
const cont = launch.continue;
if (cont) {
	// SessionManager.open of a path that does not exist starts a new, empty
	// session there: never let it.
	if (!launch.session_file || !existsSync(launch.session_file)) {
		fail(`the session to continue, ${JSON.stringify(launch.session_file)}, does not exist`);
	}
	sessionManager = sdk.SessionManager.open(launch.session_file, launch.session_dir);
	const leaf = sessionManager.getLeafId();
	if (leaf !== cont.at) {
		fail(`the session ${launch.session_file} ends at entry ${leaf}, not ${cont.at} as the adapter read it`);
	}
	const calls = new Map();
	for (const m of sessionManager.buildSessionContext().messages) {
		if (m.role === "assistant" && !failed(m)) {
			for (const b of m.content) if (b.type === "toolCall") calls.set(b.id, b.name);
		}
	}
	for (const call of cont.answer ?? []) {
		if (calls.get(call.id) !== call.name) {
			fail(`the session has no ${call.name} call ${call.id} to answer`);
		}
		sessionManager.appendMessage({
			role: "toolResult",
			toolCallId: call.id,
			toolName: call.name,
			content: [{ type: "text", text: NO_RESULT }],
			isError: true,
			timestamp: Date.now(),
		});
	}
} else {
	sessionManager = sdk.SessionManager.create(process.cwd(), launch.session_dir);
}

const authStorage = sdk.AuthStorage.create(join(launch.agent_dir, "auth.json"));
const createRuntime = async ({ cwd, agentDir, sessionManager, sessionStartEvent }) => {
	const services = await sdk.createAgentSessionServices({
		cwd,
		agentDir,
		authStorage,
		resourceLoaderOptions: {
			noExtensions: true,
			noSkills: true,
			noPromptTemplates: true,
			noThemes: true,
			noContextFiles: true,
		},
	});
	const model = services.modelRegistry.find(launch.provider, launch.model);
	const diagnostics = [...services.diagnostics];
	if (!model) {
		diagnostics.push({ type: "error", message: `no model ${launch.provider}/${launch.model} in ${join(agentDir, "models.json")}` });
	}
	const created = await sdk.createAgentSessionFromServices({ services, sessionManager, sessionStartEvent, model });
	return { ...created, services, diagnostics };
};
let runtime;
try {
	runtime = await sdk.createAgentSessionRuntime(createRuntime, {
		cwd: sessionManager.getCwd(),
		agentDir: launch.agent_dir,
		sessionManager,
	});
} catch (err) {
	fail(`cannot set up Pi's session: ${err?.message ?? err}`);
}
const errors = runtime.diagnostics.filter((d) => d.type === "error");
if (errors.length > 0) fail(errors.map((d) => d.message).join("; "));
const session = runtime.session;

let stopping = false;
for (const [signal, code] of [
	["SIGTERM", 143],
	["SIGHUP", 129],
	["SIGINT", 130],
]) {
	process.on(signal, () => {
		if (stopping) return;
		stopping = true;
		shell.killTrackedDetachedChildren();
		// Nothing more is recorded: the session stays as the signal found it.
		process.exit(code);
	});
}

const write = (v) => process.stdout.write(`${JSON.stringify(v)}\n`);
const header = sessionManager.getHeader();
if (header) write(header);
session.subscribe((event) => {
	if (event.type !== "message_update" && event.type !== "tool_execution_update") write(event);
});

let code = 0;
try {
	if (!cont) {
		await session.prompt(readFileSync(launch.task_file, "utf8"), { expandPromptTemplates: false });
	} else if (cont.ended) {
		process.stderr.write("ngharness-pi: the saved session had ended with the model's answer; nothing is sent\n");
	} else {
		const messages = session.agent.state.messages;
		const drop = cont.drop ?? 0;
		if (!messages.slice(messages.length - drop).every(failed)) {
			fail(`the session does not end with ${drop} failed replies`);
		}
		if (drop > 0) session.agent.state.messages = messages.slice(0, messages.length - drop);
		await session.agent.continue();
	}
	const messages = session.agent.state.messages;
	const last = messages[messages.length - 1];
	if (failed(last)) {
		process.stderr.write(`ngharness-pi: the model call ended in ${last.stopReason}: ${last.errorMessage ?? ""}\n`);
		code = 1;
	}
} catch (err) {
	process.stderr.write(`ngharness-pi: ${err?.message ?? err}\n`);
	code = 1;
}
try {
	await runtime.dispose();
} catch {
	// the run's outcome is what counts
}
process.exit(code);
