# Call the MCP tools this session (or run) was given: replbox's code mode.
#
#   require 'replbox'
#   Replbox.tools.list                                 # {server => [tool, ...]}
#   puts Replbox.tools.help('everything', 'echo')
#   Replbox.tools.everything.echo(message: 'hi')       # structuredContent, else the text
#
# A call returns the tool's structuredContent when it has one (a Hash), else its content:
# text as a String, images and audio as Replbox::Blob, several blocks as an Array. A tool
# that reports an error, or a call that fails, raises Replbox::ToolError with #kind. Names
# that are not identifiers (get-sum) are reachable as get_sum or with
# Replbox.tools.call('everything', 'get-sum', a: 1, b: 2).
#
# Written by replbox into the session's tools directory; the socket is the session's own
# and answers only while a cell (or the run) is being evaluated.
require 'json'
require 'socket'
require 'base64'

module Replbox
  class ToolError < StandardError
    attr_reader :kind, :server, :tool, :result

    def initialize(kind, message, server = nil, tool = nil, result = nil)
      super(message)
      @kind = kind
      @server = server
      @tool = tool
      @result = result
    end
  end

  Blob = Struct.new(:data, :mime_type)

  module Client
    module_function

    def dir
      d = ENV['REPLBOX_TOOLS']
      if d.nil? || d.empty?
        raise ToolError.new('refused', 'no MCP servers for this code: start the session (or run-code) with mcp_servers')
      end
      d
    end

    def request(msg)
      @secret ||= File.read(File.join(dir, 'secret')).strip
      sock = UNIXSocket.new(File.join(dir, 'sock'))
      begin
        sock.write(JSON.generate(msg.merge('secret' => @secret)) + "\n")
        line = sock.gets
        raise ToolError.new('failed', 'replbox closed the tools connection') if line.nil?
        JSON.parse(line)
      ensure
        sock.close
      end
    rescue Errno::ENOENT, Errno::EACCES, Errno::ECONNREFUSED => e
      raise ToolError.new('failed', "cannot reach replbox's tools socket: #{e.message}")
    end

    def content(c)
      case c['type']
      when 'text' then c['text']
      when 'image', 'audio' then Blob.new(Base64.decode64(c['data'] || ''), c['mimeType'])
      when 'resource'
        r = c['resource'] || {}
        return r['text'] if r.key?('text')
        return Blob.new(Base64.decode64(r['blob']), r['mimeType']) if r.key?('blob')
        r
      else c
      end
    end

    def value(result)
      return result['structuredContent'] unless result['structuredContent'].nil?
      blocks = (result['content'] || []).map { |c| content(c) }
      return nil if blocks.empty?
      blocks.length == 1 ? blocks[0] : blocks
    end

    def call(server, tool, args)
      reply = request('op' => 'call', 'server' => server, 'tool' => tool, 'arguments' => args || {})
      return value(reply['result'] || {}) if reply['ok']
      e = reply['error'] || {}
      raise ToolError.new(e['kind'] || 'failed', e['message'] || 'the call failed', server, tool, e['result'])
    end

    def catalog(refresh = false)
      if @catalog.nil? || refresh
        reply = request('op' => 'list')
        unless reply['ok']
          e = reply['error'] || {}
          raise ToolError.new(e['kind'] || 'failed', e['message'] || 'cannot list tools')
        end
        @catalog = {}
        (reply['servers'] || []).each { |s| @catalog[s['name']] = s }
      end
      @catalog
    end

    def ident(name)
      name.gsub(/\W/, '_')
    end
  end

  # One server: any method is one of its tools.
  class Server < BasicObject
    def initialize(name)
      @name = name
    end

    def method_missing(sym, args = nil, **kw)
      spec = Client.catalog[@name] || {}
      tools = spec['tools'] || []
      t = tools.find { |x| x['name'] == sym.to_s } || tools.find { |x| Client.ident(x['name']) == sym.to_s }
      name = t ? t['name'] : sym.to_s
      Client.call(@name, name, (args || {}).merge(kw.transform_keys(&:to_s)))
    end

    def respond_to_missing?(*)
      true
    end
  end

  # The servers this code may call.
  class Tools
    def method_missing(sym, *args)
      return super unless args.empty?
      cat = Client.catalog
      name = cat.keys.find { |s| s == sym.to_s } || cat.keys.find { |s| Client.ident(s) == sym.to_s }
      raise NoMethodError, "no MCP server #{sym} for this code; servers: #{cat.keys.join(', ')}" if name.nil?
      Server.new(name)
    end

    def respond_to_missing?(*)
      true
    end

    def [](name)
      Server.new(name)
    end

    # {server => [tool, ...]}
    def list
      Client.catalog(true).transform_values { |s| (s['tools'] || []).map { |t| t['name'] } }
    end

    # A tool's description and its arguments' JSON Schema, as text.
    def help(server, tool)
      s = Client.catalog[server] || {}
      t = (s['tools'] || []).find { |x| x['name'] == tool || Client.ident(x['name']) == tool }
      raise ToolError.new('refused', "no tool #{tool} on MCP server #{server}") if t.nil?
      text = "#{t['name']} (#{server}): #{t['description']}\nArguments (JSON Schema): #{JSON.pretty_generate(t['inputSchema'])}"
      text += "\nReturns (JSON Schema): #{JSON.pretty_generate(t['outputSchema'])}" if t['outputSchema']
      text
    end

    def call(server, tool, args = nil, **kw)
      Client.call(server, tool, (args || {}).merge(kw.transform_keys(&:to_s)))
    end
  end

  def self.tools
    @tools ||= Tools.new
  end
end
