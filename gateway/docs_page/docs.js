// The API reference page: renders the gateway's own OpenAPI document (openapi.json, beside this
// page) as one entry per operation: method, path, price, parameters, body, responses, payment
// terms. Every node is built with textContent, so nothing in the document is parsed as HTML, and
// nothing is loaded from anywhere but the gateway (the page's CSP allows nothing else).
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

  // The price an operation's x-x402 states ("$0.002205 per call"), or "free".
  function price(x402) {
    const offers = (Array.isArray(x402) ? x402 : [x402]).filter(Boolean);
    const paid = offers.filter((o) => o.scheme === "exact" && o.price);
    if (paid.length) {
      return { kind: "paid", text: paid.map((o) => `${o.price.usd} per call`).join(" or ") };
    }
    if (offers.length) return { kind: "free", text: "free, sign-in" };
    return { kind: "free", text: "free" };
  }

  function terms(x402) {
    const offers = (Array.isArray(x402) ? x402 : [x402]).filter(Boolean);
    if (!offers.length) return null;
    const section = el("section", null, el("h3", null, "Payment (x402)"));
    for (const offer of offers) {
      const list = el("dl", "terms");
      const add = (name, value) => {
        if (value !== undefined && value !== null && value !== "") list.append(el("dt", null, name), el("dd", null, value));
      };
      add("scheme", offer.scheme);
      add("network", offer.network);
      if (offer.price) add("price", `${offer.price.usd} (${offer.price.microUsdc} micro-USDC)`);
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
