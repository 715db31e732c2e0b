// The openai JS SDK's Realtime WebSocket client against llmsim (run by tests/test_realtime.py
// with the pinned openai and ws packages it installs into a cache directory).
// Usage: node realtime.mjs http://127.0.0.1:PORT
import net from 'node:net';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const client = new OpenAI({ apiKey: 'sk-test', baseURL: process.argv[2] + '/v1' });
// the SDK always dials wss://: the test server speaks plain ws, so hand it a plain TCP socket
const rt = new OpenAIRealtimeWS(
  { model: 'gpt-realtime', options: { createConnection: (o) => net.connect(o) } }, client);
const seen = [];
let text = '';
rt.on('event', (ev) => { seen.push(ev.type); });
rt.on('error', (err) => { console.log(JSON.stringify({ error: err.message })); process.exit(1); });
rt.on('session.created', () => {
  rt.send({ type: 'session.update', session: { type: 'realtime', output_modalities: ['text'] } });
  rt.send({ type: 'conversation.item.create',
            item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi' }] } });
  rt.send({ type: 'response.create' });
});
rt.on('response.output_text.delta', (ev) => { text += ev.delta; });
rt.on('response.done', (ev) => {
  console.log(JSON.stringify({ status: ev.response.status, text, seen,
                               done: ev.response.output[0].content[0].text }));
  rt.close();
});
