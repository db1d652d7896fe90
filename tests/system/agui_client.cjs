// Drives a world's AG-UI endpoint with the real @ag-ui/client (tests/test_agui.py runs it with NODE_PATH set).
// argv[2]: JSON {url, token, world, threadId, say, decision?}. Prints one JSON object: what each run saw.
// Each run records the MESSAGES_SNAPSHOT it got and the client's messages after it (`messages`: what the
// client applied, the snapshot included). Run 1 sends `say`; when it ends with a `requestApproval` call (the human-in-the-loop frontend tool) and a
// `decision` is given, run 2 answers that call with a tool message whose content is the decision.
const { HttpAgent } = require("@ag-ui/client");

const config = JSON.parse(process.argv[2]);
const approvalTool = {
  name: "requestApproval",
  description: "Ask the people of the world to approve an agent's tool call",
  parameters: { type: "object", properties: { toolName: { type: "string" }, toolArguments: { type: "object" } } },
};

async function run(agent, runId) {
  const seen = { runId, events: [], states: [], snapshots: [], text: {}, toolCalls: [], results: [] };
  const subscriber = {
    onEvent({ event }) { seen.events.push(event.type); },
    onStateSnapshotEvent({ event }) { seen.states.push(event.snapshot); },
    onMessagesSnapshotEvent({ event }) { seen.snapshots.push(event.messages); },
    onTextMessageContentEvent({ event }) {
      seen.text[event.messageId] = (seen.text[event.messageId] || "") + event.delta;
    },
    onToolCallResultEvent({ event }) { seen.results.push(event.toolCallId); },
    onToolCallEndEvent({ toolCallName, toolCallArgs, event }) {
      seen.toolCalls.push({ id: event.toolCallId, name: toolCallName, args: toolCallArgs });
    },
  };
  try {
    const result = await agent.runAgent({ runId, tools: [approvalTool] }, subscriber);
    seen.newMessages = result.newMessages.map((m) => ({ id: m.id, role: m.role, content: m.content,
      toolCalls: (m.toolCalls || []).map((c) => c.function.name) }));
    seen.messages = agent.messages;
  } catch (error) {
    seen.error = String(error && error.message || error);
  }
  return seen;
}

(async () => {
  const agent = new HttpAgent({
    url: `${config.url}/api/worlds/${config.world}/agui`,
    headers: { Authorization: `Bearer ${config.token}` },
    threadId: config.threadId,
  });
  agent.addMessage({ id: "user-1", role: "user", content: config.say });
  const runs = [await run(agent, "run-1")];
  const approval = runs[0].toolCalls.find((c) => c.name === "requestApproval");
  if (approval && config.decision) {
    agent.addMessage({ id: "answer-1", role: "tool", toolCallId: approval.id, content: JSON.stringify(config.decision) });
    runs.push(await run(agent, "run-2"));
  }
  process.stdout.write(JSON.stringify({ runs, messages: agent.messages }));
})().catch((error) => { process.stderr.write(String(error && error.stack || error)); process.exit(1); });
