// The API reference page: renders the gateway's own OpenAPI document (openapi.json, beside this
// page) as one entry per operation: method, path, price per call and in prepaid credit (a top-up:
// the credit it buys), parameters, body, responses, payment terms, a "try it" form that sends the
// request from this browser and shows the answer (a 402 decoded: cost, payee, fee payer,
// facilitator), and `pay`, Python SDK and JavaScript SDK snippets for the route. Every node is
// built with textContent, so nothing in the document or an answer is parsed as HTML, and nothing
// is loaded from anywhere but the gateway (the page's CSP allows nothing else).
"use strict";

(() => {
  const METHODS = ["get", "put", "post", "delete", "patch", "head", "options"];
  const MAX_DEPTH = 6;

  function el(tag, className, ...children) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function json(value) {
    return JSON.stringify(value, null, 2);
  }

  // A local $ref ("#/components/...") followed to what it names.
  function resolve(doc, schema) {
    for (let hops = 0; schema && typeof schema.$ref === "string" && hops < 20; hops++) {
      if (!schema.$ref.startsWith("#/")) return schema;
      schema = schema.$ref
        .slice(2)
        .split("/")
        .map((key) => key.replace(/~1/g, "/").replace(/~0/g, "~"))
        .reduce((node, key) => (node === undefined || node === null ? undefined : node[key]), doc);
    }
    return schema || {};
  }

  // "string", "array of string", "integer 1..1000", "\"a\" | \"b\"": one schema on one line.
  function typeText(doc, raw) {
    const schema = resolve(doc, raw);
    if ("const" in schema) return JSON.stringify(schema.const);
    if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
    let type = Array.isArray(schema.type) ? schema.type.join(" | ") : schema.type;
    if (!type && (schema.oneOf || schema.anyOf)) type = "one of";
    if (!type && schema.properties) type = "object";
    type = type || "any";
    if (type === "array" && schema.items) type = `array of ${typeText(doc, schema.items)}`;
    const limits = [];
    if (schema.format) limits.push(schema.format);
    if (schema.minimum !== undefined || schema.maximum !== undefined) {
      limits.push(`${schema.minimum ?? ""}..${schema.maximum ?? ""}`);
    }
    if (schema.minLength !== undefined || schema.maxLength !== undefined) {
      limits.push(`length ${schema.minLength ?? 0}..${schema.maxLength ?? ""}`);
    }
    if (schema.maxItems !== undefined) limits.push(`at most ${schema.maxItems} items`);
    if (schema.pattern) limits.push(`pattern ${schema.pattern}`);
    return limits.length ? `${type} (${limits.join(", ")})` : type;
  }

  // A schema as a nested list of its properties (and alternatives), the raw JSON beside it.
  function schemaView(doc, raw, depth = 0) {
    const schema = resolve(doc, raw);
    const list = el("ul", "schema");
    const alternatives = schema.oneOf || schema.anyOf;
    const items = schema.type === "array" ? resolve(doc, schema.items) : null;
    const properties = schema.properties || (items && items.properties);
    if (properties && depth < MAX_DEPTH) {
      const required = new Set(schema.required || (items && items.required) || []);
      for (const [name, child] of Object.entries(properties)) {
        const row = el("li", null, el("code", null, name), " ", el("span", "type", typeText(doc, child)));
        if (required.has(name)) row.append(" ", el("span", "req", "required"));
        const description = resolve(doc, child).description;
        if (description) row.append(" ", el("span", "note", description));
        const nested = resolve(doc, child);
        if (nested.properties || nested.oneOf || nested.anyOf || resolve(doc, nested.items).properties) {
          row.append(schemaView(doc, nested, depth + 1));
        }
        list.append(row);
      }
    }
    if (Array.isArray(alternatives) && depth < MAX_DEPTH) {
      alternatives.forEach((alt, i) => {
        list.append(el("li", null, el("span", "note", `option ${i + 1}: `), el("span", "type", typeText(doc, alt)),
          resolve(doc, alt).properties ? schemaView(doc, alt, depth + 1) : null));
      });
    }
    return list.childElementCount ? list : null;
  }

  function rawJson(label, value) {
    return el("details", "raw", el("summary", null, label), el("pre", null, json(value)));
  }

  function schemaBlock(doc, title, schema) {
    if (!schema || Object.keys(schema).length === 0) return null;
    return el("section", null, el("h3", null, title), el("p", null, el("span", "type", typeText(doc, schema))),
      schemaView(doc, schema), rawJson("JSON Schema", resolve(doc, schema)));
  }

  function offersOf(x402) {
    return (Array.isArray(x402) ? x402 : [x402]).filter(Boolean);
  }

  // What an operation costs, as its x-x402 states it: "$0.002205 per call · $0.000005 with
  // credit", a top-up's purchase ("$1.00 buys $1.00 of credit"), "free, sign-in" or "free".
  function price(x402) {
    const offers = offersOf(x402);
    const batch = offers.find((o) => o.methods);
    if (batch) return { kind: "paid", text: `its calls' prices + ${batch.settlementFee.usd} per request` };
    const paid = offers.filter((o) => o.scheme === "exact" && o.price);
    if (paid.length) {
      const text = paid.map((o) => {
        if (o.buysCredit) return `${o.price.usd} buys ${o.buysCredit.usd} of credit`;
        return o.creditPrice ? `${o.price.usd} per call · ${o.creditPrice.usd} with credit` : `${o.price.usd} per call`;
      });
      return { kind: "paid", text: text.join(" or ") };
    }
    if (offers.length) return { kind: "free", text: "free, sign-in" };
    return { kind: "free", text: "free" };
  }

  // micro-USDC (a string of digits) as dollars, as the gateway writes them: "$0.002205", "$1.00".
  function usd(micro) {
    const digits = String(micro).replace(/^0+(?=\d)/, "").padStart(7, "0");
    const whole = digits.slice(0, -6);
    const fraction = digits.slice(-6).replace(/0+$/, "").padEnd(2, "0");
    return `$${whole}.${fraction}`;
  }

  function terms(x402) {
    const offers = offersOf(x402);
    if (!offers.length) return null;
    const section = el("section", null, el("h3", null, "Payment (x402)"));
    for (const offer of offers) {
      const list = el("dl", "terms");
      const add = (name, value) => {
        if (value !== undefined && value !== null && value !== "") list.append(el("dt", null, name), el("dd", null, value));
      };
      if (offer.methods) {  // a provider's JSON-RPC endpoint: priced per call it carries
        add("pricing", offer.pricing);
        add("calls per request", `at most ${offer.maxCalls}`);
        add("settlement fee", `${offer.settlementFee.usd} (${offer.settlementFee.microUsdc} micro-USDC) per request`);
        for (const [name, m] of Object.entries(offer.methods)) {
          const credit = m.creditPrice ? ` · ${m.creditPrice.usd} with credit` : "";
          add(name, `${m.provider.usd} (${m.provider.microUsdc} micro-USDC) per call${credit}`);
        }
        section.append(list);
        continue;
      }
      add("scheme", offer.scheme);
      add("network", offer.network);
      if (offer.buysCredit) {
        add("buys", `${offer.buysCredit.usd} of prepaid credit (${offer.buysCredit.microUsdc} micro-USDC), ` +
          "spent by signing in on any paid route");
      }
      if (offer.price) add(offer.buysCredit ? "price" : "price per call", `${offer.price.usd} (${offer.price.microUsdc} micro-USDC)`);
      if (offer.creditPrice) {
        const lapse = offer.creditLapseDays ? `; credit lapses ${offer.creditLapseDays} days after the last top-up` : "";
        add("price with credit", `${offer.creditPrice.usd} (${offer.creditPrice.microUsdc} micro-USDC), ` +
          `signed in, from prepaid credit${lapse}`);
      }
      const parts = offer.priceParts || {};
      for (const [part, value] of Object.entries(parts)) {
        const label = `of which ${part.replace(/([A-Z])/g, " $1").toLowerCase()}`;
        if (value && value.usd) add(label, `${value.usd} (${value.microUsdc} micro-USDC)`);
      }
      add("asset", offer.asset);
      add("payTo", offer.payTo);
      section.append(list);
    }
    return section;
  }

  function parameters(doc, operation) {
    const params = (operation.parameters || []).map((p) => resolve(doc, p));
    if (!params.length) return null;
    const table = el("table", null, el("thead", null, el("tr", null, el("th", null, "name"), el("th", null, "in"),
      el("th", null, "type"), el("th", null, "description"))));
    const body = el("tbody");
    for (const p of params) {
      const name = el("td", null, el("code", null, p.name));
      if (p.required) name.append(" ", el("span", "req", "required"));
      body.append(el("tr", null, name, el("td", null, p.in), el("td", "type", typeText(doc, p.schema || {})),
        el("td", "note", p.description || resolve(doc, p.schema || {}).description || "")));
    }
    table.append(body);
    return el("section", null, el("h3", null, "Parameters"), table);
  }

  function requestBody(doc, operation) {
    const body = resolve(doc, operation.requestBody);
    const media = body.content && (body.content["application/json"] || Object.values(body.content)[0]);
    if (!media || !media.schema) return null;
    const schema = resolve(doc, media.schema);
    const section = schemaBlock(doc, "Request body (JSON)", schema);
    const examples = schema.examples || (media.example !== undefined ? [media.example] : []);
    if (section && examples.length) section.append(el("h3", null, "Example body"), el("pre", null, json(examples[0])));
    return section;
  }

  function responses(doc, operation) {
    const entries = Object.entries(operation.responses || {});
    if (!entries.length) return null;
    const table = el("table", null, el("thead", null, el("tr", null, el("th", null, "status"),
      el("th", null, "description"))));
    const body = el("tbody");
    for (const [status, raw] of entries) {
      const response = resolve(doc, raw);
      const cell = el("td", "note", response.description || "");
      const headers = Object.keys(response.headers || {});
      if (headers.length) cell.append(el("div", null, "headers: ", el("code", null, headers.join(", "))));
      body.append(el("tr", null, el("td", null, el("code", null, status)), cell));
    }
    table.append(body);
    const section = el("section", null, el("h3", null, "Responses"), table);
    const ok = resolve(doc, (operation.responses || {})["200"]);
    const okSchema = ok.content && ok.content["application/json"] && ok.content["application/json"].schema;
    const block = schemaBlock(doc, "200 body", okSchema);
    if (block) section.append(block);
    return section;
  }

  // The body an operation's schema gives as its example, or undefined.
  function exampleBody(doc, operation) {
    const body = resolve(doc, operation.requestBody);
    const media = body.content && (body.content["application/json"] || Object.values(body.content)[0]);
    if (!media || !media.schema) return undefined;
    const schema = resolve(doc, media.schema);
    if (Array.isArray(schema.examples) && schema.examples.length) return schema.examples[0];
    if (media.example !== undefined) return media.example;
    return {};
  }

  // The request's target: the path with each {name} filled in, and the query.
  function target(path, values) {
    let url = path.replace(/\{([^}]+)\}/g, (_, name) => encodeURIComponent(values.path[name] || ""));
    const query = new URLSearchParams(Object.entries(values.query).filter(([, v]) => v !== ""));
    if ([...query].length) url += `?${query}`;
    return url;
  }

  // PAYMENT-REQUIRED: base64 of UTF-8 JSON.
  function decodeRequired(header) {
    if (!header) return null;
    try {
      const bytes = Uint8Array.from(atob(header), (c) => c.charCodeAt(0));
      return JSON.parse(new TextDecoder().decode(bytes));
    } catch (error) {
      return null;
    }
  }

  // A 402 as a reader wants it: what it would cost, to whom, through which facilitator, or the
  // sign-in it asks for.
  function challengeView(required, body) {
    const view = el("dl", "terms challenge");
    const add = (name, value) => {
      if (value !== undefined && value !== null && value !== "") view.append(el("dt", null, name), el("dd", null, value));
    };
    const source = required || (body && typeof body === "object" ? body : {});
    const bodyAccepts = (body && Array.isArray(body.accepts)) ? body.accepts : [];
    add("why", source.error || "payment or sign-in required");
    (source.accepts || []).forEach((accept, i) => {
      const extra = accept.extra || {};
      add("would cost", `${usd(accept.amount)} (${accept.amount} base units of ${accept.asset}), ${accept.scheme} on ${accept.network}`);
      add("paid to", accept.payTo);
      add("fee payer", extra.feePayer || "not known yet (the facilitator has not answered)");
      const facilitator = (bodyAccepts[i] && bodyAccepts[i].facilitator) || {};
      add("facilitator", facilitator.url);
      if (accept.maxTimeoutSeconds) add("valid for", `${accept.maxTimeoutSeconds} s`);
    });
    const siwx = (source.extensions || {})["sign-in-with-x"];
    if (siwx) {
      const info = siwx.info || {};
      const paid = (source.accepts || []).length > 0;
      add(paid ? "or sign in" : "sign in", `sign-in-with-x for ${info.domain || "this gateway"}` +
        (paid ? ": a wallet with prepaid credit pays from it, no transaction" : ": free, no payment"));
    }
    return view;
  }

  async function showAnswer(out, response) {
    const text = await response.text();
    let body = text;
    try {
      body = JSON.parse(text);
    } catch (error) {
      // not JSON: shown as text
    }
    const parts = [el("p", "status", el("code", null, String(response.status)), ` ${response.statusText}`)];
    if (response.status === 402) {
      parts.push(challengeView(decodeRequired(response.headers.get("payment-required")), body));
      parts.push(rawJson("402 body", body));
    } else {
      const credit = response.headers.get("x-credit-balance");
      if (credit !== null) parts.push(el("p", "note", `X-Credit-Balance: ${credit} micro-USDC`));
      parts.push(el("pre", "data", typeof body === "string" ? body : json(body)));
    }
    out.replaceChildren(...parts);
    out.dataset.status = String(response.status);
  }

  // Send the request from this browser, without any credential: a paid route answers its 402.
  function tryIt(doc, path, method, operation) {
    const section = el("section", "try", el("h3", null, "Try it"));
    const values = { path: {}, query: {} };
    const params = (operation.parameters || []).map((p) => resolve(doc, p)).filter((p) => p.in === "path" || p.in === "query");
    for (const p of params) {
      const input = el("input");
      input.name = p.name;
      input.dataset.in = p.in;
      input.autocomplete = "off";
      const example = p.example ?? resolve(doc, p.schema || {}).example;
      if (example !== undefined) input.value = String(example);
      values[p.in][p.name] = input.value;
      input.addEventListener("input", () => { values[p.in][p.name] = input.value; });
      section.append(el("label", "field", el("code", null, p.name), ` (${p.in}) `, input));
    }
    const example = exampleBody(doc, operation);
    let area = null;
    if (example !== undefined) {
      area = el("textarea", "body-input");
      area.rows = 4;
      area.spellcheck = false;
      area.value = JSON.stringify(example);
      section.append(el("label", "field", "JSON body", area));
    }
    const send = el("button", "send", `Send ${method.toUpperCase()}`);
    send.type = "button";
    const out = el("div", "answer");
    send.addEventListener("click", async () => {
      out.replaceChildren(el("p", "note", "sending\u2026"));
      delete out.dataset.status;
      try {
        const init = { method: method.toUpperCase(), headers: { accept: "application/json" }, cache: "no-store" };
        if (area) {
          init.headers["content-type"] = "application/json";
          init.body = area.value;
        }
        await showAnswer(out, await fetch(target(path, values), init));
      } catch (error) {
        out.replaceChildren(el("p", "error", `The request failed: ${error.message}`));
        out.dataset.status = "error";
      }
    });
    section.append(el("p", null, send, " ", el("span", "note", "from this browser, with no payment: a paid route answers its 402")), out);
    return section;
  }

  function shellQuote(text) {
    return `'${text.replace(/'/g, "'\\''")}'`;
  }

  // A JSON value as a Python literal.
  function pyLiteral(value) {
    if (value === null) return "None";
    if (value === true) return "True";
    if (value === false) return "False";
    if (Array.isArray(value)) return `[${value.map(pyLiteral).join(", ")}]`;
    if (typeof value === "object") {
      return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pyLiteral(v)}`).join(", ")}}`;
    }
    return JSON.stringify(value);
  }

  // Ready-to-paste clients for this route, reading the sandbox banner's export line
  // (X402_KEYPAIR, SOLANA_RPC_URL): exact payments, and sign-in for credit and sign-in routes.
  function snippets(doc, path, method, operation) {
    const url = location.origin + path;
    const verb = method.toUpperCase();
    const body = exampleBody(doc, operation);
    const buys = offersOf(operation["x-x402"]).find((o) => o.buysCredit);
    let pay;
    if (buys) {
      const amount = Number(buys.buysCredit.microUsdc) / 1e6;
      pay = `x402-gateway pay --top-up ${amount} ${shellQuote(location.origin)} --keypair "$X402_KEYPAIR"`;
    } else {
      pay = `x402-gateway pay ${verb} ${shellQuote(url)}` +
        (body !== undefined ? ` \\\n  --data ${shellQuote(JSON.stringify(body))}` : "") +
        ` \\\n  --keypair "$X402_KEYPAIR"`;
    }
    const pyCall = body !== undefined
      ? `await http.${method}(${JSON.stringify(url)}, json=${pyLiteral(body)})`
      : `await http.${method}(${JSON.stringify(url)})`;
    const python = [
      '# pip install "x402[svm,httpx,extensions]"; X402_KEYPAIR and SOLANA_RPC_URL as the sandbox exports them',
      "import asyncio, json, os",
      "",
      "from solders.keypair import Keypair",
      "from x402 import x402Client",
      "from x402.extensions.sign_in_with_x import create_siwx_client_hook",
      "from x402.http import x402HTTPClient",
      "from x402.http.clients import x402HttpxClient",
      "from x402.mechanisms.svm import KeypairSigner",
      "from x402.mechanisms.svm.exact.register import register_exact_svm_client",
      "",
      "",
      "async def main() -> None:",
      '    with open(os.environ["X402_KEYPAIR"]) as key_file:',
      "        signer = KeypairSigner(Keypair.from_bytes(bytes(json.load(key_file))))",
      "    client = x402Client()",
      '    register_exact_svm_client(client, signer, rpc_url=os.environ["SOLANA_RPC_URL"])',
      "    signing_in = x402HTTPClient(client).on_payment_required(create_siwx_client_hook(signer))",
      "    async with x402HttpxClient(signing_in, timeout=30) as http:",
      `        response = ${pyCall}`,
      "        print(response.status_code, response.json())",
      '        print("PAYMENT-RESPONSE", response.headers.get("payment-response"))',
      "",
      "",
      "asyncio.run(main())",
    ].join("\n");
    const init = body !== undefined
      ? `{\n  method: ${JSON.stringify(verb)},\n  headers: { "content-type": "application/json" },\n  body: JSON.stringify(${JSON.stringify(body)}),\n}`
      : `{ method: ${JSON.stringify(verb)} }`;
    const js = [
      "// npm install @x402/fetch @x402/svm @x402/extensions @solana/kit; node pay.mjs",
      'import { readFileSync } from "node:fs";',
      'import { createKeyPairSignerFromBytes } from "@solana/kit";',
      'import { createSIWxClientHook } from "@x402/extensions/sign-in-with-x";',
      'import { wrapFetchWithPayment, x402Client, x402HTTPClient } from "@x402/fetch";',
      'import { ExactSvmScheme, toClientSvmSigner } from "@x402/svm";',
      "",
      'const secret = new Uint8Array(JSON.parse(readFileSync(process.env.X402_KEYPAIR, "utf8")));',
      "const keypair = await createKeyPairSignerFromBytes(secret);",
      "const client = new x402Client().register(",
      '  "solana:*",',
      "  new ExactSvmScheme(toClientSvmSigner(keypair), { rpcUrl: process.env.SOLANA_RPC_URL }),",
      ");",
      "const signingIn = new x402HTTPClient(client).onPaymentRequired(createSIWxClientHook(keypair));",
      "const fetchWithPayment = wrapFetchWithPayment(fetch, signingIn);",
      `const response = await fetchWithPayment(${JSON.stringify(url)}, ${init});`,
      "console.log(response.status, await response.json());",
      'console.log("PAYMENT-RESPONSE", response.headers.get("payment-response"));',
    ].join("\n");
    const block = (name, lang, code) => {
      const pre = el("pre", `snippet ${lang}`, code);
      pre.dataset.snippet = lang;
      return el("details", "snippet", el("summary", null, name), pre);
    };
    return el("section", "snippets", el("h3", null, "Call it"),
      block("x402-gateway pay", "pay", pay),
      block("Python SDK", "python", python),
      block("JavaScript SDK", "js", js));
  }

  function operationEntry(doc, path, method, operation) {
    const cost = price(operation["x-x402"]);
    const id = operation.operationId || `${method}-${path}`;
    const head = el("summary", null,
      el("span", `method ${method}`, method.toUpperCase()),
      el("span", "path", path),
      el("span", `price ${cost.kind}`, cost.text),
      operation.summary ? el("span", "summary", operation.summary) : null);
    const details = el("details", "op", head, el("div", "body",
      el("p", "note", "operation ", el("code", null, id)),
      terms(operation["x-x402"]),
      tryIt(doc, path, method, operation),
      operation["x-x402"] ? snippets(doc, path, method, operation) : null,
      parameters(doc, operation),
      requestBody(doc, operation),
      responses(doc, operation)));
    details.id = id;
    details.dataset.method = method;
    details.dataset.path = path;
    details.dataset.search = [method, path, id, operation.summary || "", (operation.tags || []).join(" ")]
      .join(" ")
      .toLowerCase();
    return details;
  }

  function render(doc) {
    const info = doc.info || {};
    document.title = `${info.title || "API"} reference`;
    document.getElementById("title").textContent = `${info.title || "API"} reference`;
    const server = (doc.servers || [])[0];
    const meta = document.getElementById("meta");
    meta.append(`version ${info.version || "?"}, OpenAPI ${doc.openapi || "?"}`);
    if (server && server.url) meta.append(", served from ", el("code", null, server.url));
    meta.append(" · ");
    const source = el("a", null, "openapi.json");
    source.href = "openapi.json";
    meta.append(source);
    document.getElementById("description").textContent = info.description || "";

    const groups = new Map();
    for (const [path, item] of Object.entries(doc.paths || {})) {
      for (const method of METHODS) {
        const operation = item[method];
        if (!operation) continue;
        const group = (operation.tags || ["other"])[0];
        if (!groups.has(group)) groups.set(group, []);
        groups.get(group).push(operationEntry(doc, path, method, operation));
      }
    }
    const main = document.getElementById("operations");
    main.replaceChildren();
    let total = 0;
    for (const [group, entries] of groups) {
      const section = el("section", "group", el("h2", null, group, " ", el("span", "count", `(${entries.length})`)));
      section.dataset.group = group;
      section.dataset.total = String(entries.length);
      section.append(...entries);
      main.append(section);
      total += entries.length;
    }
    if (!total) main.append(el("p", "note", "This gateway publishes no operations."));
    document.getElementById("filter").addEventListener("input", (event) => filter(event.target.value));
  }

  function filter(text) {
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    for (const section of document.querySelectorAll("section.group")) {
      let shown = 0;
      for (const op of section.querySelectorAll("details.op")) {
        op.hidden = !words.every((word) => op.dataset.search.includes(word));
        if (!op.hidden) shown++;
      }
      section.hidden = shown === 0;
      const total = section.dataset.total;
      section.querySelector(".count").textContent = words.length ? `(${shown} of ${total})` : `(${total})`;
    }
  }

  function openLinked() {
    const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView();
    }
  }

  async function main() {
    const root = document.documentElement;
    try {
      const response = await fetch("openapi.json", { headers: { accept: "application/json" } });
      if (!response.ok) throw new Error(`openapi.json answered ${response.status}`);
      render(await response.json());
      openLinked();
      window.addEventListener("hashchange", openLinked);
      root.dataset.state = "ready";
    } catch (error) {
      const status = document.getElementById("status") || el("p");
      status.id = "status";
      status.className = "error";
      status.textContent = `Could not render the API reference: ${error.message}`;
      document.getElementById("operations").replaceChildren(status);
      root.dataset.state = "error";
    }
  }

  main();
})();
