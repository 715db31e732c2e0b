import { GoogleGenAI } from "@google/genai";
const ai = new GoogleGenAI({ apiKey: "k", httpOptions: { baseUrl: process.argv[2] } });
const out = {};
const r = await ai.models.generateContent({ model: "gemini-2.0-flash", contents: "Say hi" });
out.text = r.text; out.usage = r.usageMetadata;
let n = 0, text = "";
for await (const c of await ai.models.generateContentStream({ model: "gemini-2.0-flash", contents: "Explain TCP", config: { maxOutputTokens: 12 } })) { n++; text += c.text ?? ""; }
out.chunks = n; out.streamText = text;
out.tokens = (await ai.models.countTokens({ model: "gemini-2.0-flash", contents: "hello world" })).totalTokens;
const e = await ai.models.embedContent({ model: "gemini-embedding-001", contents: ["a"], config: { outputDimensionality: 16 } });
out.dims = e.embeddings[0].values.length;
try { await ai.models.generateContent({ model: "gemini-2.0-flash", contents: "x", config: { candidateCount: 99 } }); }
catch (err) { out.error = { status: err.status, message: String(err.message).slice(0, 80) }; }
console.log(JSON.stringify(out));
