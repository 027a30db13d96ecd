// What useChat runs (the ai package's AbstractChat over DefaultChatTransport), against the
// example chat server: node chat_client.mjs ai5|ai7 BASE_URL SESSION < steps.json
// Each step is {"do": "send"|"regenerate"|"stop"|"reload"|"edit", "text"?, "index"?}.
// After each it prints the client's messages and status with the session's head version, so
// the test can compare them with the stored fold at that version.
const [major, base, session] = process.argv.slice(2);
const ai = await import(major);

class State {
  constructor(messages = []) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(m) { this.messages = this.messages.concat(m); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; }
  snapshot(thing) { return structuredClone(thing); }
}

class TestChat extends ai.AbstractChat {
  constructor(messages) {
    super({
      id: session,
      state: new State(messages),
      transport: new ai.DefaultChatTransport({ api: `${base}/api/chat` }),
      onError: () => {},
    });
  }
}

const path = (suffix) => `${base}/api/chat/${encodeURIComponent(session)}/${suffix}`;
const json = (v) => JSON.parse(JSON.stringify(v));

async function until(check, what, seconds = 20) {
  const deadline = Date.now() + seconds * 1000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

const replyText = (chat) => {
  const last = chat.messages[chat.messages.length - 1];
  return last?.role === "assistant" ? last.parts.filter((p) => p.type === "text").map((p) => p.text).join("") : "";
};

// Until the reply to the message just sent (after `count` messages) has streamed a few words.
const midReply = (chat, count) => until(
  () => chat.messages.length > count + 1 && replyText(chat).split(" ").length >= 4, "a few streamed words");

async function head() {
  const r = await fetch(`${base}/sessions/${encodeURIComponent(session)}/history`);
  const events = await r.json();
  return events.length ? events[events.length - 1].version : 0;
}

async function loaded() {
  const r = await fetch(path("messages"));
  return (await r.json()).messages;
}

const steps = JSON.parse(await new Response(process.stdin).text());
let chat = new TestChat([]);
const out = [];
for (const step of steps) {
  const note = {};
  if (step.do === "send") {
    await chat.sendMessage({ text: step.text });
  } else if (step.do === "regenerate") {
    await chat.regenerate();
  } else if (step.do === "edit") {
    const users = chat.messages.filter((m) => m.role === "user");
    await chat.sendMessage({ text: step.text, messageId: users[step.index].id });
  } else if (step.do === "stop") {
    // The page's stop button: the stop request (recorded, so the reply ends for everyone),
    // then the client's stop(). The server's end of the stream reaches the client first.
    const count = chat.messages.length;
    const sending = chat.sendMessage({ text: step.text });
    await midReply(chat, count);
    note.stop = (await fetch(path("stop"), { method: "POST" })).status;
    await sending;
    await chat.stop();
  } else if (step.do === "reload") {
    // A reload mid-reply: the page goes away (its request aborted: the server goes on), a new
    // page loads the stored messages and resumes the open turn from the log.
    const count = chat.messages.length;
    const sending = chat.sendMessage({ text: step.text });
    await midReply(chat, count);
    await chat.stop();
    await sending;
    note.cut = replyText(chat);
    chat = new TestChat(await loaded());
    await chat.resumeStream();
    note.resumed = replyText(chat);
  }
  out.push({ step: step.do, status: chat.status, error: chat.error ? String(chat.error.message) : null,
             messages: json(chat.messages), version: await head(), ...note });
}
process.stdout.write(JSON.stringify(out));
