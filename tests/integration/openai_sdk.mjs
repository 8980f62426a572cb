// The official OpenAI Node SDK against aned-http, with tools: chat.completions.create
// (streamed and not) and the runTools helper. The model (mk_chain_model.py) always
// answers with one call get_weather({"city": "Paris"}) in its template's Hermes syntax,
// so every check below needs the call parsed out of the reply and carried through
// OpenAI's shapes. Prints "N passed, M failed".
//   node openai_sdk.mjs BASE_URL API_KEY NODE_MODULES_DIR
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const [baseURL, apiKey, modules] = process.argv.slice(2);
const require = createRequire(modules + '/');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

let passed = 0, failed = 0;
async function check(name, fn) {
  try { await fn(); passed++; console.log('ok   ' + name); }
  catch (e) { failed++; console.log('FAIL ' + name + ': ' + (e && e.stack || e)); }
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

await check('create with tools', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, tools, temperature: 0, max_tokens: 64 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  const tc = c.message.tool_calls[0];
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris' });
});

await check('create with tools, streamed', async () => {
  const s = await client.chat.completions.create({ model: 'any', messages, tools, temperature: 0, max_tokens: 64, stream: true });
  const calls = [];
  let finish = null, content = '';
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const d of ch.delta.tool_calls || []) {
      const c = calls[d.index] || (calls[d.index] = { id: '', name: '', arguments: '' });
      if (d.id) c.id = d.id;
      if (d.function && d.function.name) c.name += d.function.name;
      if (d.function && d.function.arguments) c.arguments += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris' });
  // the SDK's own accumulation of the same stream
  const s2 = client.beta.chat.completions.stream({ model: 'any', messages, tools, temperature: 0, max_tokens: 64 });
  const fin = await s2.finalChatCompletion();
  assert.equal(fin.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });
});

await check('tool_choice none: the reply is text', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, tools, tool_choice: 'none', temperature: 0, max_tokens: 64 });
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.match(r.choices[0].message.content, /^<tool_call>/);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('tool_choice required and named: a call, finish_reason tool_calls', async () => {
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    // one call, arguments bounded: the chain model's greedy reply would otherwise go round
    const strict = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
      properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false } } }];
    const r = await client.chat.completions.create({ model: 'any', messages, tools: strict, tool_choice, max_tokens: 200, temperature: 0,
                                                     parallel_tool_calls: false });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls && calls.length === 1 && calls[0].function.name === 'get_weather');
    assert.equal(typeof JSON.parse(calls[0].function.arguments), 'object');
  }
});

await check('runTools', async () => {
  const seen = [];
  const runner = client.beta.chat.completions.runTools({
    model: 'any', messages, temperature: 0, max_tokens: 64,
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
      parameters: tools[0].function.parameters, parse: JSON.parse,
      function: async (args) => { seen.push(args); return 'sunny, 21 C'; } } }],
  }, { maxChatCompletions: 2 });
  await runner.done();
  // each of the two completions called the function; the second was asked with the
  // first call and its result in the conversation (assistant tool_calls + a tool message)
  assert.equal(seen.length, 2);
  assert.deepEqual(seen[0], { city: 'Paris' });
  const msgs = runner.messages;
  const toolMsgs = msgs.filter((m) => m.role === 'tool');
  assert.ok(toolMsgs.length >= 1 && toolMsgs[0].content === 'sunny, 21 C');
  assert.ok(msgs.some((m) => m.role === 'assistant' && m.tool_calls && m.tool_calls[0].id === toolMsgs[0].tool_call_id));
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
